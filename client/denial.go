package client

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The denial cache (Options.DenialCache): a denial consumes nothing and, refunds aside, a limiter
// only recovers with time, so the same call is denied again until its RetryAfter has passed.
// The cache answers those calls without the server.

const (
	denialShards = 64
	// denialsPerKey bounds the denials kept for one server key (one per limit, cost and
	// reserve): a principal is usually denied one way at a time.
	denialsPerKey = 4
)

type denials struct {
	seed     maphash.Seed
	perShard int
	shut     atomic.Bool // Close was called: every call goes to the server
	shards   [denialShards]denialShard
}

type denialShard struct {
	mu        sync.Mutex
	m         map[string][]denial // by server key
	nextSweep int64
	_         [32]byte // keeps two shards' mutexes off one cache line
}

// denial is one denied call: its limit and reserve (tag), its cost, and the server's reply.
type denial struct {
	tag   string
	cost  int64
	at    int64 // when the denied call was sent (ns, the Limiter's clock)
	until int64 // at + RetryAfter: the server denies the same call until then at least
	res   Result
}

func newDenials(maxKeys int) *denials {
	d := &denials{seed: maphash.MakeSeed(), perShard: max(1, (maxKeys+denialShards-1)/denialShards)}
	for i := range d.shards {
		d.shards[i].m = map[string][]denial{}
	}
	return d
}

func (d *denials) shard(serverKey []byte) *denialShard {
	return &d.shards[maphash.Bytes(d.seed, serverKey)%denialShards]
}

// get answers the call of cost on sk (stateKey: the server key is sk[:n]) from a denial that
// still holds at now.
func (d *denials) get(sk []byte, n int, cost, now int64) (Result, bool) {
	sh := d.shard(sk[:n])
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, e := range sh.m[string(sk[:n])] {
		if e.cost == cost && e.tag == string(sk[n:]) && now < e.until {
			r := e.res
			r.RetryAfter = time.Duration(e.until - now)
			r.ResetAfter = max(0, r.ResetAfter-time.Duration(now-e.at))
			r.Source = FromDenialCache
			return r, true
		}
	}
	return Result{}, false
}

// put records a denial of the call of cost on sk sent at sent. The server ran the call after it
// was sent, so sent + RetryAfter is no later than when the server would admit it again.
func (d *denials) put(sk []byte, n int, cost, sent, now int64, res Result) {
	until := sent + int64(res.RetryAfter)
	if res.RetryAfter <= 0 || res.RetryAfter == Never || until <= now {
		return
	}
	e := denial{tag: string(sk[n:]), cost: cost, at: sent, until: until, res: res}
	sh := d.shard(sk[:n])
	sh.mu.Lock()
	defer sh.mu.Unlock()
	list, ok := sh.m[string(sk[:n])]
	if !ok {
		if now >= sh.nextSweep {
			d.sweep(sh, now)
		}
		if len(sh.m) >= d.perShard {
			d.evict(sh)
		}
		sh.m[string(sk[:n])] = append(make([]denial, 0, 1), e)
		return
	}
	// the same call's denial, else an expired one, else the one that expires first, makes room
	victim, soonest := -1, int64(math.MaxInt64)
	for i := range list {
		switch {
		case list[i].cost == cost && list[i].tag == e.tag:
			list[i] = e
			return
		case list[i].until < soonest:
			victim, soonest = i, list[i].until
		}
	}
	if len(list) < denialsPerKey && soonest > now {
		sh.m[string(sk[:n])] = append(list, e)
		return
	}
	list[victim] = e
}

// drop forgets serverKey's denials: this Limiter refunded it.
func (d *denials) drop(serverKey []byte) {
	sh := d.shard(serverKey)
	sh.mu.Lock()
	delete(sh.m, string(serverKey))
	sh.mu.Unlock()
}

// dropPrincipal forgets every denial of the server keys that begin with prefix, a principal's
// (its Block or Unblock through this Limiter changed what they would answer). It walks every
// shard: an operator's call, not a request's.
func (d *denials) dropPrincipal(prefix []byte) {
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			if strings.HasPrefix(k, string(prefix)) {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// len is how many server keys hold denials, expired ones included until swept.
func (d *denials) len() int {
	n := 0
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// sweep drops the keys whose denials have all expired; sh.mu is held.
func (d *denials) sweep(sh *denialShard, now int64) {
	for k, list := range sh.m {
		if lastUntil(list) <= now {
			delete(sh.m, k)
		}
	}
	sh.nextSweep = now + sweepEvery
}

// evict drops, of a few keys, the one whose denials end first; sh.mu is held.
func (d *denials) evict(sh *denialShard) {
	var victim string
	soonest := int64(math.MaxInt64)
	n := 0
	for k, list := range sh.m {
		if u := lastUntil(list); u < soonest {
			victim, soonest = k, u
		}
		if n++; n == evictSample {
			break
		}
	}
	delete(sh.m, victim)
}

func lastUntil(list []denial) int64 {
	var last int64
	for _, e := range list {
		last = max(last, e.until)
	}
	return last
}
