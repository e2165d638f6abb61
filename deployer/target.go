package deployer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/versions"
)

// Target is a discovered deployment: its topology and one connection per node, dialed on
// first use with the seed's credentials and TLS settings. Close it when done.
type Target struct {
	opt  valkey.ClientOption // the seed's options; each node is dialed with a copy
	seed string
	dial func(opt valkey.ClientOption, addr string) (*conn, error) // nil: dial; tests replace it

	mu    sync.Mutex
	topo  Topology
	conns map[string]*dialed
}

// dialed is one node's connection, dialed at most once.
type dialed struct {
	once sync.Once
	c    *conn
	err  error
}

// maxHops bounds following replicas of replicas in a standalone setup.
const maxHops = 8

// Discover finds every node of the deployment the first seed node that answers belongs to
// (opt.InitAddress, in order; the errors of all when none does). A cluster node
// gives every node in its CLUSTER NODES view, primaries owning no slots included, and
// nodes flagged fail, pfail, handshake or noaddr too (with Node.Down saying so): a node
// the cluster knows of is never left out. A standalone server gives its primary (found
// through master_host when the seed is a replica) and every replica below it, from INFO
// replication; a primary that cannot be dialled is listed with the replicas found below
// it, and Inspect finds it unreachable.
func Discover(ctx context.Context, opt valkey.ClientOption) (*Target, error) {
	if len(opt.InitAddress) == 0 {
		return nil, errors.New("deployer: no address to discover from")
	}
	// Each seed in turn, as a cluster client starts from the first that answers: a cluster's
	// URL names several (?addr=, REDIS_TYPE=cluster) so that one node down does not stop it.
	var errs []error
	for _, seed := range opt.InitAddress {
		t := &Target{opt: opt, seed: seed}
		topo, err := t.discover(ctx)
		if err == nil {
			t.topo = topo
			return t, nil
		}
		t.Close()
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// Close closes every node's connection, after any dial in flight.
func (t *Target) Close() {
	t.mu.Lock()
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	for _, d := range conns {
		d.once.Do(func() {}) // waits for a dial in flight; stops one from starting
		if d.c != nil {
			d.c.close()
		}
	}
}

// Topology returns the nodes as discovered.
func (t *Target) Topology() Topology {
	t.mu.Lock()
	defer t.mu.Unlock()
	topo := t.topo
	topo.Nodes = append([]Node(nil), topo.Nodes...)
	return topo
}

// conn returns the connection to addr, dialing it on first use. The dial runs outside
// t.mu, so a node that takes its dial timeout to fail delays only the callers that want
// that node. A failed dial is remembered for the Target's lifetime: the node is
// unreachable to this Target (Discover again to retry), and a deploy that goes on without
// it does not wait for another timeout each time something asks for it.
func (t *Target) conn(addr string) (*conn, error) {
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[string]*dialed{}
	}
	d, ok := t.conns[addr]
	if !ok {
		d = &dialed{}
		t.conns[addr] = d
	}
	t.mu.Unlock()
	d.once.Do(func() {
		dialFn := t.dial
		if dialFn == nil {
			dialFn = dial
		}
		d.c, d.err = dialFn(t.opt, addr)
	})
	return d.c, d.err
}

func (t *Target) discover(ctx context.Context) (Topology, error) {
	seed, err := t.conn(t.seed)
	if err != nil {
		return Topology{}, fmt.Errorf("deployer: %s: %w", t.seed, err)
	}
	info, err := seed.info(ctx, "cluster")
	if err != nil {
		return Topology{}, fmt.Errorf("deployer: %s: %w", t.seed, err)
	}
	if infoField(info, "cluster_enabled") == "1" {
		return t.discoverCluster(ctx, seed)
	}
	if strings.TrimSpace(info) == "" {
		// A server has a cluster section, if only to say cluster_enabled:0; a Sentinel has
		// none, nor a replication one, and would be "a server without a role".
		if srv, err := seed.info(ctx, "server"); err == nil && (infoField(srv, "server_mode") == "sentinel" || infoField(srv, "redis_mode") == "sentinel") {
			return Topology{}, fmt.Errorf("deployer: %s is a Sentinel: give the URL of a node it monitors, such as its primary (SENTINEL GET-MASTER-ADDR-BY-NAME tells it)", t.seed)
		}
	}
	return t.discoverStandalone(ctx)
}

func (t *Target) discoverCluster(ctx context.Context, seed *conn) (Topology, error) {
	text, err := seed.clusterNodes(ctx)
	if err != nil {
		return Topology{}, fmt.Errorf("deployer: %s: %w", t.seed, err)
	}
	host, _, _ := net.SplitHostPort(t.seed)
	topo, err := parseClusterNodes(text, host)
	if err != nil {
		return Topology{}, fmt.Errorf("%w (from %s)", err, t.seed)
	}
	for i := range topo.Nodes {
		topo.Nodes[i].Down += remedy(topo.Nodes[i], t.seed)
	}
	return topo, nil
}

func (t *Target) discoverStandalone(ctx context.Context) (Topology, error) {
	replOf := func(addr string) (replication, error) {
		c, err := t.conn(addr)
		if err != nil {
			return replication{}, fmt.Errorf("deployer: %s: %w", addr, err)
		}
		text, err := c.info(ctx, "replication")
		if err != nil {
			return replication{}, fmt.Errorf("deployer: %s: %w", addr, err)
		}
		r, err := parseReplication(text)
		if err != nil {
			return replication{}, fmt.Errorf("%w (from %s)", err, addr)
		}
		return r, nil
	}
	// Up to the primary...
	top, below := t.seed, "" // below: the replica top was found as the primary of
	r, err := replOf(top)
	for hops := 0; err == nil && r.Role == RoleReplica; hops++ {
		if hops == maxHops {
			return Topology{}, fmt.Errorf("deployer: no primary found within %d hops up from %s", maxHops, t.seed)
		}
		top, below = r.Primary, top
		r, err = replOf(top)
	}
	if err != nil {
		if _, derr := t.conn(top); below == "" || derr == nil {
			return Topology{}, err
		}
		// The primary a replica names cannot be dialled (it is down, or the replica's
		// master_host is wrong): it is listed with the replicas known below it, and Inspect
		// finds it unreachable (a failed dial is remembered), rather than the whole target
		// being unreadable from a replica that answers. Only a failed dial: a primary that
		// answers, then fails, might be read by Inspect, and its other replicas would be
		// missing without a word.
		r = replication{Role: RolePrimary, Replicas: []string{below}}
	}
	// ...then every replica below it, breadth first.
	var topo Topology
	topo.Nodes = append(topo.Nodes, Node{Addr: top, Role: RolePrimary})
	seen := map[string]bool{top: true}
	type edge struct{ addr, primary string }
	queue := []edge{}
	for _, a := range r.Replicas {
		queue = append(queue, edge{a, top})
	}
	for depth := 0; len(queue) > 0; depth++ {
		var next []edge
		for _, e := range queue {
			if seen[e.addr] {
				continue
			}
			seen[e.addr] = true
			topo.Nodes = append(topo.Nodes, Node{Addr: e.addr, Role: RoleReplica, Primary: e.primary})
			if depth == maxHops {
				continue
			}
			rr, err := replOf(e.addr)
			if err != nil {
				// Still listed: Inspect reports it unreachable rather than it vanishing.
				continue
			}
			for _, a := range rr.Replicas {
				next = append(next, edge{a, e.addr})
			}
		}
		queue = next
	}
	sortNodes(topo.Nodes)
	return topo, nil
}

// Installed is what one node runs, as Inspect read and identified it. A node is in
// exactly one of these conditions: unreachable (Unreachable set), unsupported (Unsupported
// set), or read (Code, Version, Declared and Engine say what it runs).
type Installed struct {
	Node     Node
	Server   Server // what the node is, from INFO server; zero when unreachable or not told
	Code     string // the ratelimit library's code; "" when absent
	Engine   string // the engine the library runs on, from FUNCTION LIST ("LUA")
	Version  string // the release Code is (code and engine), "" when absent or drifted
	Declared string // the version Code declares, if any (tells what drifted code claims to be)
	// Unreachable says why the node could not be read: the cluster holds it to be down
	// (Node.Down), or it did not answer. The other fields are empty.
	Unreachable error
	// Unsupported says why a node that answers cannot run Functions (FUNCTION or FCALL
	// unknown, a server before Redis 7.0); Code is empty.
	Unsupported string
	// Warnings are problems that do not stop a deploy, each with the node's address: e.g.
	// a server missing known Lua security fixes (WarnLuaSecurity).
	Warnings []Warning
}

// Identify is what a node running code on engine runs, identified against set: the release
// it is, or drifted. It is the one place code is identified.
func Identify(n Node, code, engine string, set versions.Set) Installed {
	in := Installed{Node: n, Code: code, Engine: engine}
	if code == "" {
		return in
	}
	in.Declared, _ = versions.Declared(code)
	if r, ok := set.Identify(code); ok && luaEngine(engine) {
		in.Version = r.Version
	}
	return in
}

// luaEngine reports whether engine is the one every release runs on ("" when not told).
func luaEngine(engine string) bool { return engine == "" || strings.EqualFold(engine, "lua") }

// inspectParallelism bounds the nodes read at once.
const inspectParallelism = 16

// Inspect reads every node of the topology, in topology order: what the server is (INFO
// server), the library it runs (FUNCTION LIST LIBRARYNAME ratelimit WITHCODE), and whether
// it has FCALL, in one round trip; then identifies the code against set. A node the cluster
// holds to be down is not dialled. The error return is only for a cancelled ctx.
func (t *Target) Inspect(ctx context.Context, set versions.Set) ([]Installed, error) {
	nodes := t.Topology().Nodes
	out := make([]Installed, len(nodes))
	sem := make(chan struct{}, inspectParallelism)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i] = t.inspect(ctx, n, set)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("deployer: inspect: %w", err)
	}
	return out, nil
}

func (t *Target) inspect(ctx context.Context, n Node, set versions.Set) Installed {
	if n.Down != "" {
		return Installed{Node: n, Unreachable: errors.New(n.Down)}
	}
	c, err := t.conn(n.Addr)
	if err != nil {
		return Installed{Node: n, Unreachable: err}
	}
	rd, err := c.read(ctx)
	if err != nil {
		return Installed{Node: n, Unreachable: err}
	}
	in := Identify(n, rd.code, rd.engine, set)
	in.Server, in.Unsupported = rd.server, rd.unsupported
	if in.Unsupported == "" {
		in.Unsupported = rd.server.unsupported()
	}
	if in.Unsupported != "" {
		in.Code, in.Engine, in.Version, in.Declared = "", "", "", ""
	}
	in.Warnings = rd.server.warnings()
	for i := range in.Warnings {
		in.Warnings[i].Addr = n.Addr
	}
	return in
}

type codeResult struct {
	code, engine string
	err          error
}

// readCodes reads the library's code on every node, at most inspectParallelism at once.
func (t *Target) readCodes(ctx context.Context, nodes []Node) []codeResult {
	out := make([]codeResult, len(nodes))
	sem := make(chan struct{}, inspectParallelism)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := t.conn(n.Addr)
			if err == nil {
				out[i].code, out[i].engine, err = c.libraryCode(ctx)
			}
			out[i].err = err
		})
	}
	wg.Wait()
	return out
}

// refresh discovers the target again, for a process that keeps one Target (a reconciler):
// from the seed, or, when it does not answer, from any other address the URL gave or any
// node last discovered, so that one dead seed does not blind it. A failed dial is forgotten
// (the node is dialled again), and the connections of nodes no longer listed are closed.
func (t *Target) refresh(ctx context.Context) error {
	t.mu.Lock()
	candidates := append([]string{t.seed}, t.opt.InitAddress...)
	for _, n := range t.topo.Nodes {
		if n.Down == "" {
			candidates = append(candidates, n.Addr)
		}
	}
	for addr, d := range t.conns {
		if d.c == nil && d.err != nil {
			delete(t.conns, addr)
		}
	}
	t.mu.Unlock()
	var first error
	for _, seed := range candidates {
		t.mu.Lock()
		t.seed = seed
		t.mu.Unlock()
		topo, err := t.discover(ctx)
		if err != nil {
			if first == nil {
				first = err
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		t.mu.Lock()
		t.topo = topo
		listed := map[string]bool{}
		for _, n := range topo.Nodes {
			listed[n.Addr] = true
		}
		var gone []*dialed
		for addr, d := range t.conns {
			if !listed[addr] && !slices.Contains(t.opt.InitAddress, addr) {
				gone = append(gone, d)
				delete(t.conns, addr)
			}
		}
		t.mu.Unlock()
		for _, d := range gone {
			if d.c != nil {
				d.c.close()
			}
		}
		return nil
	}
	return first
}
