package deployer

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// Discover finds every node of the deployment the seed node belongs to. A cluster node
// gives every node in its CLUSTER NODES view, primaries owning no slots included, nodes
// flagged fail, handshake or noaddr left out with a note. A standalone server gives its
// primary (found through master_host when the seed is a replica) and every replica below
// it, from INFO replication.
func Discover(ctx context.Context, opt valkey.ClientOption) (*Target, error) {
	if len(opt.InitAddress) == 0 {
		return nil, errors.New("deployer: no address to discover from")
	}
	t := &Target{opt: opt, seed: opt.InitAddress[0]}
	topo, err := t.discover(ctx)
	if err != nil {
		t.Close()
		return nil, err
	}
	t.topo = topo
	return t, nil
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
	topo.Notes = append([]string(nil), topo.Notes...)
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
	return t.discoverStandalone(ctx)
}

func (t *Target) discoverCluster(ctx context.Context, seed *conn) (Topology, error) {
	text, err := seed.clusterNodes(ctx)
	if err != nil {
		return Topology{}, fmt.Errorf("deployer: %s: %w", t.seed, err)
	}
	host, _, _ := net.SplitHostPort(t.seed)
	nodes, notes, err := parseClusterNodes(text, host)
	if err != nil {
		return Topology{}, fmt.Errorf("%w (from %s)", err, t.seed)
	}
	return Topology{Cluster: true, Nodes: nodes, Notes: notes}, nil
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
	top := t.seed
	r, err := replOf(top)
	for hops := 0; err == nil && r.Role == RoleReplica; hops++ {
		if hops == maxHops {
			return Topology{}, fmt.Errorf("deployer: no primary found within %d hops up from %s", maxHops, t.seed)
		}
		top = r.Primary
		r, err = replOf(top)
	}
	if err != nil {
		return Topology{}, err
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
				topo.Notes = append(topo.Notes, fmt.Sprintf("%s: replicas below it not read: %v", e.addr, err))
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

// Installed is what one node runs.
type Installed struct {
	Node     Node
	Code     string // the ratelimit library's code; "" when absent
	Version  string // the release Code is, "" when absent or drifted
	Declared string // the version Code declares, if any (tells what drifted code claims to be)
	Err      error  // the node could not be read; the other fields are empty
}

// inspectParallelism bounds the nodes read at once.
const inspectParallelism = 16

// Inspect reads FUNCTION LIST LIBRARYNAME ratelimit WITHCODE on every node, in topology
// order, and identifies the code against set. A node that cannot be read has Err set; the
// error return is only for a cancelled ctx.
func (t *Target) Inspect(ctx context.Context, set versions.Set) ([]Installed, error) {
	nodes := t.Topology().Nodes
	codes := t.readCodes(ctx, nodes)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("deployer: inspect: %w", err)
	}
	out := make([]Installed, len(nodes))
	for i, n := range nodes {
		out[i] = Installed{Node: n, Code: codes[i].code, Err: codes[i].err}
		if codes[i].err != nil || codes[i].code == "" {
			continue
		}
		out[i].Declared, _ = versions.Declared(codes[i].code)
		if r, ok := set.Identify(codes[i].code); ok {
			out[i].Version = r.Version
		}
	}
	return out, nil
}

type codeResult struct {
	code string
	err  error
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
				out[i].code, err = c.libraryCode(ctx)
			}
			out[i].err = err
		})
	}
	wg.Wait()
	return out
}
