package client

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// breakers are a Limiter's circuit breakers: one for a standalone server (or a sentinel's
// primary), one per shard of a cluster, so that a dead shard opens its own breaker and the
// others' calls go on. A shard's breaker is its primary's, found by the key's hash slot in a
// table of the cluster's slots: looking one up is a CRC16 of the key and an atomic load, with
// no lock and no allocation. The table comes from CLUSTER SLOTS (what valkey-go itself reads,
// and what the service user may run), asked in the background: on the first call, and again
// whenever a breaker opens, as a failover or a resharding moves slots to another primary.
// Until it is known, and for the slots no primary serves, a cluster's calls share the
// Limiter-wide breaker.
type breakers struct {
	threshold int
	cooldown  time.Duration
	single    *breaker // standalone; a cluster's slots the table does not map
	cluster   bool

	table      atomic.Pointer[slotTable]
	refreshing atomic.Bool  // a refresh is running: at most one at a time
	lastTry    atomic.Int64 // when the last refresh started, on the Limiter's clock
}

// slotTable maps each hash slot to its primary's breaker.
type slotTable struct {
	owner    [numSlots]uint16 // index in breakers; 0 is single
	breakers []*breaker
	ids      []string // the primaries' node IDs, by index (ids[0] is "")
	addrs    []string // the primaries' host:port, by index (addrs[0] is "")
}

// down reports whether addr is a primary whose breaker is not closed.
func (t *slotTable) down(addr string) bool {
	if t == nil {
		return false
	}
	for i, a := range t.addrs {
		if a == addr && i > 0 {
			return t.breakers[i].current() != closed
		}
	}
	return false
}

const numSlots = 16384

// noSlot is valkey-go's mark on a command that a standalone client built (cmds.NoSlot): such a
// client has no slots, and a Limiter on it keeps one breaker.
const noSlot = 1 << 15

func newBreakers(vk valkey.Client, threshold int, cooldown time.Duration) *breakers {
	b := &breakers{threshold: threshold, cooldown: cooldown, single: newBreaker(threshold, cooldown)}
	// Mode() would do, but a mock records it as a call; the builder tells the same without one.
	probe := vk.B().Get().Key("rlfn").Build()
	b.cluster = probe.Slot()&noSlot == 0
	return b
}

// breakerOf returns the breaker of key's node. Before the cluster's slots are known, it starts
// asking for them and returns the shared breaker.
func (l *Limiter) breakerOf(key string) *breaker {
	bs := l.breakers
	if !bs.cluster {
		return bs.single
	}
	t := bs.table.Load()
	if t == nil {
		l.refreshSlots(false)
		return bs.single
	}
	return t.breakers[t.owner[keySlot(key)]]
}

// refreshSlots reads the cluster's slots again in the background, unless a refresh is running
// or, when not forced, one started less than a cooldown ago.
func (l *Limiter) refreshSlots(force bool) {
	bs := l.breakers
	if !bs.cluster {
		return
	}
	now := l.clock()
	if !force && bs.lastTry.Load() != 0 && now-bs.lastTry.Load() < int64(bs.cooldown) {
		return
	}
	if !bs.refreshing.CompareAndSwap(false, true) {
		return
	}
	bs.lastTry.Store(now)
	go func() {
		defer bs.refreshing.Store(false)
		defer func() { _ = recover() }() // a bad reply keeps the old table, never crashes the service
		if t := l.fetchSlots(bs.table.Load()); t != nil {
			bs.table.Store(t)
		}
	}()
}

// fetchSlots asks the cluster's nodes, one after the other, for CLUSTER SLOTS until one
// answers, and builds the table from it, keeping old's breakers of the primaries that remain.
// It returns nil when no node answers. The primaries whose breaker is open are asked last: a
// refresh runs when a breaker opens, and asking its dead node first would dial it again.
func (l *Limiter) fetchSlots(old *slotTable) *slotTable {
	wait := max(2*l.deadline, 250*time.Millisecond)
	ask := func(c valkey.Client) *slotTable {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		entries, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
		if err != nil {
			return nil
		}
		return l.buildSlots(old, entries)
	}
	var later []valkey.Client
	for addr, c := range l.vk.Nodes() {
		if old.down(addr) {
			later = append(later, c)
			continue
		}
		if t := ask(c); t != nil {
			return t
		}
	}
	for _, c := range later {
		if t := ask(c); t != nil {
			return t
		}
	}
	return nil
}

// buildSlots makes a table of a CLUSTER SLOTS reply: [start, end, [host, port, id, ...],
// replicas...] for each range.
func (l *Limiter) buildSlots(old *slotTable, entries []valkey.ValkeyMessage) *slotTable {
	bs := l.breakers
	kept := map[string]*breaker{}
	if old != nil {
		for i, id := range old.ids[1:] {
			kept[id] = old.breakers[i+1]
		}
	}
	t := &slotTable{breakers: []*breaker{bs.single}, ids: []string{""}, addrs: []string{""}}
	index := map[string]uint16{}
	for _, e := range entries {
		r, err := e.ToArray()
		if err != nil || len(r) < 3 {
			return nil
		}
		start, err1 := r[0].AsInt64()
		end, err2 := r[1].AsInt64()
		primary, err3 := r[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(primary) < 2 || start < 0 || end >= numSlots || start > end {
			return nil
		}
		host, _ := primary[0].ToString()
		port, _ := primary[1].AsInt64()
		addr := host + ":" + itoa(port)
		id := ""
		if len(primary) >= 3 {
			id, _ = primary[2].ToString()
		}
		if id == "" {
			id = addr
		}
		i, ok := index[id]
		if !ok {
			b := kept[id]
			if b == nil {
				b = newBreaker(bs.threshold, bs.cooldown)
				b.addr = addr
			}
			i = uint16(len(t.breakers))
			index[id] = i
			t.breakers = append(t.breakers, b)
			t.ids = append(t.ids, id)
			t.addrs = append(t.addrs, addr)
		}
		for s := start; s <= end; s++ {
			t.owner[s] = i
		}
	}
	return t
}

func itoa(n int64) string { return string(appendInt(nil, n)) }

// keySlot is the cluster hash slot of every state key of key: the CRC16 of its hash tag, the
// key as appendKey escapes it, computed without writing it out.
func keySlot(key string) uint16 {
	if key == "" {
		return crc16Byte(0, '%') & (numSlots - 1)
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			crc = crc16Byte(crc16Byte(crc16Byte(crc, '%'), '2'), '5')
		case '{':
			crc = crc16Byte(crc16Byte(crc16Byte(crc, '%'), '7'), 'B')
		case '}':
			crc = crc16Byte(crc16Byte(crc16Byte(crc, '%'), '7'), 'D')
		default:
			crc = crc16Byte(crc, c)
		}
	}
	return crc & (numSlots - 1)
}

func crc16Byte(crc uint16, c byte) uint16 {
	return crc<<8 ^ crc16tab[byte(crc>>8)^c]
}

// crc16tab is CRC16-CCITT (XMODEM), the cluster's key hash.
var crc16tab = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
