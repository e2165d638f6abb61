package harness

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// clusterTimeout bounds forming a cluster or adding a node to it.
const clusterTimeout = 60 * time.Second

// Cluster is a Valkey cluster of one container per node, formed by the
// harness. Primaries and Replicas describe the cluster as built (plus nodes
// from AddPrimary); failovers do not update them. Not safe for concurrent use
// with AddPrimary.
type Cluster struct {
	Primaries []*Server
	Replicas  []*Server

	replicasOf map[*Server][]*Server
}

// StartCluster starts primaries*(1+replicasPerPrimary) Valkey nodes, spreads
// the 16384 slots evenly over the primaries, attaches replicasPerPrimary
// replicas to each, and returns once every node reports cluster_state:ok and
// every replica is attached. The nodes are removed when the test ends.
func StartCluster(t testing.TB, primaries, replicasPerPrimary int) *Cluster {
	t.Helper()
	Require(t, ValkeyImage())
	began := time.Now()
	c, err := NewCluster(t.Context(), primaries, replicasPerPrimary)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Cleanup(func() { terminate(t, c.Nodes()...) })
	t.Logf("harness: cluster of %d primaries, %d replicas up in %s",
		len(c.Primaries), len(c.Replicas), time.Since(began).Round(time.Millisecond))
	return c
}

// NewCluster is StartCluster for callers without a test, such as a TestMain
// that shares one cluster between tests: the caller terminates it.
func NewCluster(ctx context.Context, primaries, replicasPerPrimary int) (*Cluster, error) {
	if primaries < 1 || replicasPerPrimary < 0 {
		return nil, fmt.Errorf("cluster of %d primaries with %d replicas each: need at least one primary and no negative replica count",
			primaries, replicasPerPrimary)
	}
	if err := Available(ValkeyImage()); err != nil {
		return nil, err
	}
	nodes, err := startNodes(ctx, primaries*(1+replicasPerPrimary))
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		// capped: AddPrimary appends to Primaries, which must not overwrite Replicas[0]
		Primaries:  nodes[:primaries:primaries],
		Replicas:   nodes[primaries:],
		replicasOf: map[*Server][]*Server{},
	}
	for i, r := range c.Replicas {
		p := c.Primaries[i/replicasPerPrimary]
		c.replicasOf[p] = append(c.replicasOf[p], r)
	}
	fctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	if err := c.form(fctx); err != nil {
		desc := c.describe()
		_ = c.Terminate(context.Background())
		return nil, fmt.Errorf("form a cluster of %d primaries with %d replicas each: %v\n%s",
			primaries, replicasPerPrimary, err, desc)
	}
	return c, nil
}

// Terminate removes every node of the cluster.
func (c *Cluster) Terminate(ctx context.Context) error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, s := range c.Nodes() {
		wg.Go(func() {
			if err := s.Terminate(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("terminate %s: %w", s.Addr, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startNodes starts n cluster nodes in parallel: a node takes a few hundred
// milliseconds to start, a 3x1 cluster would take seconds one by one. On
// failure the nodes that did start are removed.
func startNodes(ctx context.Context, n int) ([]*Server, error) {
	nodes := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			nodes[i], errs[i] = startServer(ctx, spec{image: ValkeyImage(), binary: "valkey-server", cluster: true})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range nodes {
			if s != nil {
				_ = s.Terminate(context.Background())
			}
		}
		return nil, err
	}
	return nodes, nil
}

// Nodes returns the primaries, then the replicas.
func (c *Cluster) Nodes() []*Server {
	return append(append([]*Server(nil), c.Primaries...), c.Replicas...)
}

// Addrs returns the addresses of all nodes, primaries first.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, s := range c.Nodes() {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// ReplicasOf returns the replicas StartCluster attached to primary p.
func (c *Cluster) ReplicasOf(p *Server) []*Server {
	return c.replicasOf[p]
}

// Client returns a cluster client seeded with every node, closed when the test
// ends. With sendToReplicas, read-only commands (GET, FCALL_RO, ...) go to a
// random replica of the key's primary (the primary if it has none), through
// valkey-go's ClientOption.SendToReplicas; other commands go to the primary.
func (c *Cluster) Client(t testing.TB, sendToReplicas bool) valkey.Client {
	t.Helper()
	opt := valkey.ClientOption{InitAddress: c.Addrs(), DisableCache: true}
	if sendToReplicas {
		opt.SendToReplicas = func(cmd valkey.Completed) bool { return cmd.IsReadOnly() }
	}
	cl, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("harness: cluster client for %v: %v", opt.InitAddress, err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// AddPrimary starts a new node and joins it to the cluster as a primary
// owning no slots (e.g. a freshly added node before resharding), then waits
// as Wait does. The node is appended to Primaries and removed when the test
// ends.
func (c *Cluster) AddPrimary(t testing.TB) *Server {
	t.Helper()
	return c.newNode(t, "add primary", c.join)
}

// newNode starts a node, removed when the test ends, and has join make it one of c's, within
// clusterTimeout; what names the step in the failure.
func (c *Cluster) newNode(t testing.TB, what string, join func(context.Context, *Server) error) *Server {
	t.Helper()
	nodes, err := startNodes(t.Context(), 1)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	s := nodes[0]
	t.Cleanup(func() { terminate(t, s) })
	ctx, cancel := context.WithTimeout(t.Context(), clusterTimeout)
	defer cancel()
	if err := join(ctx, s); err != nil {
		t.Fatalf("harness: %s %s: %v\n%s", what, s.Addr, err, c.describe())
	}
	return s
}

func (c *Cluster) join(ctx context.Context, s *Server) error {
	if err := s.readID(ctx); err != nil {
		return err
	}
	var seed *Server
	for _, n := range c.Nodes() {
		if n.Running() {
			seed = n
			break
		}
	}
	if seed == nil {
		return errors.New("no running node to meet")
	}
	if err := seed.do(ctx, seed.admin.B().ClusterMeet().Ip("127.0.0.1").Port(int64(s.Port)).Build()); err != nil {
		return err
	}
	c.Primaries = append(c.Primaries, s)
	return c.Wait(ctx)
}

// Wait returns once every running node reports cluster_state:ok, knows every
// other running node as healthy, sees one primary per shard, and every
// running replica has its link to its primary up. Use it after Start on a
// stopped node or after a failover. It does not wait for the failure of a
// stopped node to be detected: poll ROLE on its replica for that.
func (c *Cluster) Wait(ctx context.Context) error {
	return waitFor(ctx, "a healthy cluster", func() error { return c.check(ctx, false) })
}

// form turns the fresh, standalone cluster nodes into one cluster.
func (c *Cluster) form(ctx context.Context) error {
	nodes := c.Nodes()
	for i, s := range nodes {
		if err := s.readID(ctx); err != nil {
			return err
		}
		// Distinct config epochs up front, as valkey-cli does, rather than
		// leaving equal epochs to the nodes' collision resolution.
		if err := s.do(ctx, s.admin.B().ClusterSetConfigEpoch().ConfigEpoch(int64(i+1)).Build()); err != nil {
			return err
		}
	}
	for i, p := range c.Primaries {
		lo, hi := i*16384/len(c.Primaries), (i+1)*16384/len(c.Primaries)-1
		if err := p.do(ctx, p.admin.B().ClusterAddslotsrange().StartSlotEndSlot().
			StartSlotEndSlot(int64(lo), int64(hi)).Build()); err != nil {
			return err
		}
	}
	seed := nodes[0]
	for _, s := range nodes[1:] {
		if err := seed.do(ctx, seed.admin.B().ClusterMeet().Ip("127.0.0.1").Port(int64(s.Port)).Build()); err != nil {
			return err
		}
	}
	// A replica can only replicate a primary it knows by ID.
	if err := waitFor(ctx, "every node to know every other", func() error {
		return c.meshed(ctx, nodes)
	}); err != nil {
		return err
	}
	for _, p := range c.Primaries {
		for _, r := range c.replicasOf[p] {
			if err := r.do(ctx, r.admin.B().ClusterReplicate().NodeId(p.NodeID).Build()); err != nil {
				return err
			}
		}
	}
	return waitFor(ctx, "cluster_state:ok and every replica attached", func() error {
		return c.check(ctx, true)
	})
}

// check reports why the running nodes are not (yet) a healthy cluster. With
// asBuilt, every replica must also be attached to the primary it was given.
func (c *Cluster) check(ctx context.Context, asBuilt bool) error {
	var running []*Server
	for _, s := range c.Nodes() {
		if s.Running() {
			running = append(running, s)
		}
	}
	if err := c.meshed(ctx, running); err != nil {
		return err
	}
	for _, s := range running {
		info, err := verbatim(s.admin.Do(ctx, s.admin.B().ClusterInfo().Build()))
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", s.Addr)
		}
		view, err := s.clusterNodes(ctx)
		if err != nil {
			return err
		}
		// Valkey 8.0 persists a replica's shard ID; if it is restarted while
		// its nodes.conf has a replica in another shard than its primary, it
		// refuses to start ("corrupted cluster config file", valkey#774), so
		// the shards must have converged before tests may kill nodes.
		if err := s.checkShards(ctx); err != nil {
			return err
		}
		if asBuilt {
			for _, p := range c.Primaries {
				if !view[p.NodeID].flags["master"] {
					return fmt.Errorf("%s does not see %s as a primary yet", s.Addr, p.Addr)
				}
				for _, r := range c.replicasOf[p] {
					if e := view[r.NodeID]; !e.flags["slave"] || e.master != p.NodeID {
						return fmt.Errorf("%s does not see %s as a replica of %s yet", s.Addr, r.Addr, p.Addr)
					}
				}
			}
		}
		if view[s.NodeID].flags["slave"] {
			role, err := s.admin.Do(ctx, s.admin.B().Role().Build()).ToArray()
			if err != nil {
				return fmt.Errorf("%s: ROLE: %w", s.Addr, err)
			}
			// A replica's ROLE: slave, primary ip, primary port, link state, offset.
			if len(role) < 4 {
				return fmt.Errorf("%s: unexpected ROLE reply of %d elements", s.Addr, len(role))
			}
			if state, _ := role[3].ToString(); state != "connected" {
				return fmt.Errorf("%s: replication link is %q, not connected", s.Addr, state)
			}
		}
	}
	return nil
}

// meshed reports why some node does not yet know every other one as a
// healthy peer.
func (c *Cluster) meshed(ctx context.Context, nodes []*Server) error {
	for _, s := range nodes {
		view, err := s.clusterNodes(ctx)
		if err != nil {
			return err
		}
		for _, o := range nodes {
			e, ok := view[o.NodeID]
			if !ok {
				return fmt.Errorf("%s does not know %s yet", s.Addr, o.Addr)
			}
			for _, f := range []string{"handshake", "noaddr", "fail?", "fail"} {
				if e.flags[f] {
					return fmt.Errorf("%s sees %s with flag %s", s.Addr, o.Addr, f)
				}
			}
		}
	}
	return nil
}

// describe returns every node's CLUSTER NODES, for failure messages.
func (c *Cluster) describe() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b strings.Builder
	for _, s := range c.Nodes() {
		text, err := verbatim(s.admin.Do(ctx, s.admin.B().ClusterNodes().Build()))
		if err != nil {
			text = err.Error() + "\n"
		}
		fmt.Fprintf(&b, "CLUSTER NODES on %s:\n%s", s.Addr, text)
	}
	return b.String()
}

// checkShards reports a shard, in the node's CLUSTER SHARDS view, without
// exactly one primary (e.g. a replica whose shard ID is not yet its primary's).
// Nodes marked failed are left out: a killed primary stays in the view, with
// its shard, after its replica took over.
func (s *Server) checkShards(ctx context.Context) error {
	shards, err := s.admin.Do(ctx, s.admin.B().ClusterShards().Build()).ToArray()
	if err != nil {
		return fmt.Errorf("%s: CLUSTER SHARDS: %w", s.Addr, err)
	}
	for _, sh := range shards {
		m, err := sh.AsMap()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SHARDS: %w", s.Addr, err)
		}
		field := m["nodes"]
		nodes, err := field.ToArray()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SHARDS nodes: %w", s.Addr, err)
		}
		var ids []string
		primaries := 0
		for _, n := range nodes {
			nm, err := n.AsMap()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER SHARDS node: %w", s.Addr, err)
			}
			idMsg, roleMsg, healthMsg := nm["id"], nm["role"], nm["health"]
			id, _ := idMsg.ToString()
			role, _ := roleMsg.ToString()
			if health, _ := healthMsg.ToString(); health == "fail" || health == "failed" {
				continue
			}
			ids = append(ids, id+" "+role)
			if role == "master" || role == "primary" {
				primaries++
			}
		}
		if len(ids) > 0 && primaries != 1 {
			return fmt.Errorf("%s sees a shard with %d primaries: %v", s.Addr, primaries, ids)
		}
	}
	return nil
}

// Slots returns how many hash slots this cluster node owns in its own view.
func (s *Server) Slots(ctx context.Context) (int, error) {
	view, err := s.clusterNodes(ctx)
	if err != nil {
		return 0, err
	}
	return view[s.NodeID].slots, nil
}

// nodeEntry is one line of CLUSTER NODES.
type nodeEntry struct {
	master string // primary's ID for a replica, "-" for a primary
	flags  map[string]bool
	slots  int
}

// clusterNodes returns the node's CLUSTER NODES view by node ID.
func (s *Server) clusterNodes(ctx context.Context) (map[string]nodeEntry, error) {
	text, err := verbatim(s.admin.Do(ctx, s.admin.B().ClusterNodes().Build()))
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER NODES: %w", s.Addr, err)
	}
	view := map[string]nodeEntry{}
	for line := range strings.Lines(text) {
		// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		e := nodeEntry{master: f[3], flags: map[string]bool{}}
		for flag := range strings.SplitSeq(f[2], ",") {
			e.flags[flag] = true
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // slot being migrated or imported
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if isRange {
				b, _ = strconv.Atoi(hi)
			}
			e.slots += b - a + 1
		}
		view[f[0]] = e
	}
	return view, nil
}

// verbatim returns a text reply. Over RESP3 (valkey-go's default) CLUSTER
// NODES, CLUSTER INFO and INFO are verbatim strings, which valkey-go hands
// over with their "txt:" format prefix.
func verbatim(r valkey.ValkeyResult) (string, error) {
	s, err := r.ToString()
	if len(s) >= 4 && s[3] == ':' {
		s = s[4:]
	}
	return s, err
}

func (s *Server) readID(ctx context.Context) error {
	id, err := s.admin.Do(ctx, s.admin.B().ClusterMyid().Build()).ToString()
	if err != nil {
		return fmt.Errorf("%s: CLUSTER MYID: %w", s.Addr, err)
	}
	s.NodeID = id
	return nil
}

// do runs an admin command that must answer OK.
func (s *Server) do(ctx context.Context, cmd valkey.Completed) error {
	args := strings.Join(cmd.Commands(), " ")
	if err := s.admin.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("%s: %s: %w", s.Addr, args, err)
	}
	return nil
}
