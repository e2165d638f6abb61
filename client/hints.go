package client

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/rlfn/rlfn/internal/keys"
)

// hints remember, for decisions across keys (AllowAll with rules of several Keys), the keys
// whose last answer said they would deny the next call of the same cost: denied, or admitted
// with less than the cost remaining. Such a key is decided first, on its own, so that a refused
// request costs the server one call rather than one per key plus the refunds of the keys that
// admitted it (see decideAcross). The server still decides every call: a hint only orders them,
// and a wrong one costs one round trip of latency, never a wrong decision.
//
// A hint lasts until the limiter's ResetAfter (it is back to its initial state), or until the
// key admits with room to spare. At most hintKeys keys are held; when full, a shard drops its
// expired hints, then any.
type hints struct {
	seed   maphash.Seed
	shards [hintShards]hintShard
}

const (
	hintShards = 64
	hintKeys   = 16384 // about 1.5 MB when full, with keys of about 30 bytes
	perShard   = hintKeys / hintShards
)

type hintShard struct {
	mu sync.Mutex
	m  map[string]int64 // server key -> until (the Limiter's clock, ns)
	_  [48]byte         // keeps two shards' mutexes off one cache line
}

func newHints() *hints {
	h := &hints{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].m = map[string]int64{}
	}
	return h
}

func (h *hints) shard(key []byte) *hintShard {
	return &h.shards[maphash.Bytes(h.seed, key)%hintShards]
}

// denies reports whether key's last answer said the next call would be denied, and still
// holds at now.
func (h *hints) denies(key []byte, now int64) bool {
	sh := h.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	until, ok := sh.m[string(key)]
	return ok && now < until
}

// note records what res, key's answer to a call of cost, says of the next such call.
func (h *hints) note(key []byte, res Result, cost, now int64) {
	next := !res.Allowed || res.Remaining < cost
	sh := h.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !next {
		delete(sh.m, string(key))
		return
	}
	last := res.ResetAfter
	if !res.Allowed && res.RetryAfter != Never {
		last = max(last, res.RetryAfter)
	}
	if last <= 0 {
		return
	}
	if _, ok := sh.m[string(key)]; !ok && len(sh.m) >= perShard {
		for k, until := range sh.m {
			if until <= now {
				delete(sh.m, k)
			}
		}
		for k := range sh.m {
			if len(sh.m) < perShard {
				break
			}
			delete(sh.m, k)
		}
	}
	sh.m[string(key)] = now + int64(min(last, time.Hour))
}

// hintKey is the key of g's hint: its first limiter's server key.
func (l *Limiter) hintKey(g *group) []byte {
	c := &g.calls[0]
	return keys.Append(nil, l.prefix, g.key, c.alg.name, c.name)
}
