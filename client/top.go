package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/topkeys"
)

// top is what Options.TopKeys turns on: for each policy (a limit's algorithm and Name), the
// keys it denies most, in a Space-Saving sketch of k counters (Metwally et al.), so that
// memory stays bounded however many keys are denied; published every TopEvery to a small
// expiring key of this process, which rlfn top merges with every other process's.
type top struct {
	k     int
	every time.Duration
	vk    valkey.Client
	key   string // <prefix>{%top}:<process id>

	mu       sync.Mutex
	policies map[topPolicy]*sketch

	stop chan struct{}
	once sync.Once
	done chan struct{}
}

// maxTopPolicies bounds the policies tracked: a service's limits are in its code, so a few;
// past this many, a new policy's denials are not tracked.
const maxTopPolicies = 256

type topPolicy struct{ alg, name string }

// sketch is Space-Saving over k counters: a key not counted replaces the least counted one
// and inherits its count (as its error), so that every key denied more than n/k times of n
// is among the k, and each count is over by at most its error.
type sketch struct {
	counts map[string]*topCount
}

type topCount struct {
	Denials    int64 // an upper bound: the true count is at least Denials - Error
	Error      int64
	RetryAfter time.Duration // of the last denial
	Last       time.Time
}

func newTop(vk valkey.Client, prefix string, k int, every time.Duration) *top {
	var id [8]byte
	rand.Read(id[:])
	t := &top{k: k, every: every, vk: vk, policies: map[topPolicy]*sketch{},
		key:  topkeys.Key(prefix) + ":" + hex.EncodeToString(id[:]),
		stop: make(chan struct{}), done: make(chan struct{})}
	go t.run()
	return t
}

// denied counts a denial of key by c's policy.
func (t *top) denied(key string, c *call, res Result) {
	p := topPolicy{c.alg.name, c.name}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.policies[p]
	if s == nil {
		if len(t.policies) >= maxTopPolicies {
			return
		}
		s = &sketch{counts: make(map[string]*topCount, t.k)}
		t.policies[p] = s
	}
	e := s.counts[key]
	if e == nil {
		if len(s.counts) < t.k {
			e = &topCount{}
		} else {
			var minKey string
			for k, v := range s.counts {
				if e == nil || v.Denials < e.Denials {
					minKey, e = k, v
				}
			}
			delete(s.counts, minKey)
			e.Error = e.Denials
		}
		s.counts[key] = e
	}
	e.Denials++
	e.RetryAfter = res.RetryAfter
	e.Last = time.Now()
}

// topAll counts a denial of AllowAll against the rule that decided it (Options.TopKeys).
func (l *Limiter) topAll(rules []Rule, res Result, err error) {
	if l.top == nil || err != nil || res.Allowed || res.Rule >= len(rules) {
		return
	}
	r := rules[res.Rule]
	c := call{spec: r.Limit.spec()}
	l.top.denied(r.Key, &c, res)
}

// snapshot is the sketch's keys, most denied first.
func (t *top) snapshot() []topkeys.Entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []topkeys.Entry
	for p, s := range t.policies {
		for k, v := range s.counts {
			out = append(out, topkeys.Entry{Algorithm: p.alg, Name: p.name, Key: k, Denials: v.Denials, Error: v.Error,
				RetryAfterMs: retryAfterMs(v.RetryAfter), LastMs: v.Last.UnixMilli()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Denials > out[j].Denials })
	return out
}

// run publishes the top every t.every, to a key that expires after three periods: a process
// that stops leaves no trace for long.
func (t *top) run() {
	defer close(t.done)
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.publish()
		}
	}
}

func (t *top) publish() {
	entries := t.snapshot()
	if len(entries) == 0 {
		return
	}
	b, _ := json.Marshal(entries)
	ctx, cancel := context.WithTimeout(context.Background(), t.every)
	defer cancel()
	_ = t.vk.Do(ctx, t.vk.B().Set().Key(t.key).Value(string(b)).Px(3*t.every).Build()).Error()
}

// close stops publishing.
func (t *top) close() {
	t.once.Do(func() { close(t.stop) })
	<-t.done
}
