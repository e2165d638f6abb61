package harness

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// MeetPrimary starts a new node and joins it to the cluster with CLUSTER MEET, as an
// operator or a Kubernetes operator does (not valkey-cli --cluster add-node, which also
// copies the functions): it owns no slots and has no library. Unlike AddPrimary it does not
// wait for a healthy cluster, only for every running node to know the new one. The node is
// appended to Primaries and removed when the test ends.
func (c *Cluster) MeetPrimary(t testing.TB) *Server {
	t.Helper()
	return c.newNode(t, "meet", c.meet)
}

func (c *Cluster) meet(ctx context.Context, s *Server) error {
	if err := s.readID(ctx); err != nil {
		return err
	}
	var running []*Server
	for _, n := range c.Nodes() {
		if n.Running() {
			running = append(running, n)
		}
	}
	if len(running) == 0 {
		return fmt.Errorf("no running node to meet")
	}
	seed := running[0]
	if err := seed.do(ctx, seed.admin.B().ClusterMeet().Ip("127.0.0.1").Port(int64(s.Port)).Build()); err != nil {
		return err
	}
	c.Primaries = append(c.Primaries, s)
	return waitFor(ctx, "every node to know "+s.Addr, func() error { return c.meshed(ctx, append(running, s)) })
}

// MoveSlots moves slots lo..hi, with their keys, from one primary to another as resharding
// does: SETSLOT IMPORTING and MIGRATING, MIGRATE of every key (its state goes with it), then
// SETSLOT NODE on both and every other running node. Meanwhile a client's call on a key
// not yet moved is served by from, one already moved is redirected (ASK).
func (c *Cluster) MoveSlots(ctx context.Context, from, to *Server, lo, hi int) error {
	// Eight slots at once: each is independent of the others, and one at a time spends its
	// time waiting on round trips.
	slots := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for slot := range slots {
				if err := c.moveSlot(ctx, from, to, slot); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for slot := lo; slot <= hi; slot++ {
		select {
		case slots <- slot:
		case err = <-errs:
			break feed
		}
	}
	close(slots)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return err
}

func (c *Cluster) moveSlot(ctx context.Context, from, to *Server, slot int) error {
	sl := int64(slot)
	if err := to.do(ctx, to.admin.B().ClusterSetslot().Slot(sl).Importing().NodeId(from.NodeID).Build()); err != nil {
		return err
	}
	if err := from.do(ctx, from.admin.B().ClusterSetslot().Slot(sl).Migrating().NodeId(to.NodeID).Build()); err != nil {
		return err
	}
	for {
		keys, err := from.admin.Do(ctx, from.admin.B().ClusterGetkeysinslot().Slot(sl).Count(100).Build()).AsStrSlice()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER GETKEYSINSLOT %d: %w", from.Addr, slot, err)
		}
		if len(keys) == 0 {
			break
		}
		cmd := from.admin.B().Arbitrary("MIGRATE", "127.0.0.1", strconv.Itoa(to.Port), "", "0", "5000", "KEYS").Args(keys...).Build().Pin()
		// A node that missed pings on a loaded machine may hold the cluster down for a
		// moment: tried again, as an operator's tool would, for up to clusterTimeout.
		if err := transient(ctx, func() error { return from.admin.Do(ctx, cmd).Error() }); err != nil {
			return fmt.Errorf("%s: MIGRATE slot %d to %s: %w", from.Addr, slot, to.Addr, err)
		}
	}
	// The new owner first, then the old one, as valkey-cli does: no moment when neither
	// claims the slot.
	order := []*Server{to, from}
	for _, n := range c.Nodes() {
		if n != to && n != from && n.Running() {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if err := n.do(ctx, n.admin.B().ClusterSetslot().Slot(sl).Node().NodeId(to.NodeID).Build()); err != nil {
			return err
		}
	}
	return nil
}

// ReplacePrimary stops victim, a primary with no replica, and gives its slots to a new,
// empty node, as one replaces a dead shard: the new node joins with CLUSTER MEET, every
// other node forgets the victim (CLUSTER FORGET), and the new node claims the slots with
// CLUSTER ADDSLOTSRANGE under a bumped config epoch. The keys of those slots are lost with
// the victim, and the new node has no library. It returns once the cluster is healthy; the
// new node takes the victim's place in Primaries.
func (c *Cluster) ReplacePrimary(t testing.TB, victim *Server) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), clusterTimeout)
	defer cancel()
	ranges, err := ownedRanges(ctx, victim)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if err := victim.Stop(ctx); err != nil {
		t.Fatalf("harness: stop %s: %v", victim.Addr, err)
	}
	i := slices.Index(c.Primaries, victim)
	c.Primaries = slices.Delete(c.Primaries, i, i+1)
	for _, n := range c.Nodes() {
		if n.Running() {
			if err := n.do(ctx, n.admin.B().ClusterForget().NodeId(victim.NodeID).Build()); err != nil {
				t.Fatalf("harness: %v", err)
			}
		}
	}
	nodes, err := startNodes(t.Context(), 1)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	s := nodes[0]
	t.Cleanup(func() { terminate(t, s) })
	if err := c.meet(ctx, s); err != nil {
		t.Fatalf("harness: meet %s: %v\n%s", s.Addr, err, c.describe())
	}
	// BUMPEPOCH answers BUMPED or STILL: a new epoch above the victim's, so that every
	// node takes the new claim over what it remembers.
	if err := s.admin.Do(ctx, s.admin.B().ClusterBumpepoch().Build()).Error(); err != nil {
		t.Fatalf("harness: %s: CLUSTER BUMPEPOCH: %v", s.Addr, err)
	}
	for _, r := range ranges {
		if err := s.do(ctx, s.admin.B().ClusterAddslotsrange().StartSlotEndSlot().StartSlotEndSlot(int64(r[0]), int64(r[1])).Build()); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("harness: replace %s by %s: %v\n%s", victim.Addr, s.Addr, err, c.describe())
	}
	return s
}

// ownedRanges returns the slot ranges s serves, from its CLUSTER SLOTS.
func ownedRanges(ctx context.Context, s *Server) ([][2]int, error) {
	slots, err := s.admin.Do(ctx, s.admin.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER SLOTS: %w", s.Addr, err)
	}
	var out [][2]int
	for _, e := range slots {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("%s: CLUSTER SLOTS: unexpected entry", s.Addr)
		}
		lo, _ := f[0].AsInt64()
		hi, _ := f[1].AsInt64()
		owner, _ := f[2].ToArray()
		if len(owner) < 2 {
			continue
		}
		if port, _ := owner[1].AsInt64(); int(port) == s.Port {
			out = append(out, [2]int{int(lo), int(hi)})
		}
	}
	return out, nil
}

// transient runs do until it succeeds, fails otherwise than CLUSTERDOWN or TRYAGAIN, or
// clusterTimeout has passed.
func transient(ctx context.Context, do func() error) error {
	deadline := time.Now().Add(clusterTimeout)
	for {
		err := do()
		// Contains, not a prefix: MIGRATE reports the target's refusal inside its own error
		// ("Target instance replied with error: CLUSTERDOWN ...").
		if err == nil || !strings.Contains(err.Error(), "CLUSTERDOWN") && !strings.Contains(err.Error(), "TRYAGAIN") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
