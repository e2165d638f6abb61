package client

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/versions"
)

// selfload.go: Options.LoadLibrary. A node that answers "no such function" (a primary that
// joined or replaced a dead one after the last deploy) has its keys decided by the Fallback
// until someone loads the library; a service that may (its user has FUNCTION LOAD) can do it
// itself, with the newest release it was built with (never the working copy, which may be a
// release in the making that no deploy would install). Only onto a node that has none: FUNCTION LOAD
// without REPLACE fails on one that has a library, whatever it is, so a release deployed
// meanwhile, newer or older, is never replaced. Never on the decision path: the call that
// found the node goes to the Fallback, and the load runs in the background.

// selfLoader remembers, per node, when the Limiter last tried to load it.
type selfLoader struct {
	code string

	mu   sync.Mutex
	last map[*breaker]int64 // the Limiter's clock at the last attempt, by node
}

func newSelfLoader() *selfLoader {
	return &selfLoader{code: versions.Embedded().Latest().Code, last: map[*breaker]int64{}}
}

// loadLibrary loads the library onto br's node in the background, unless LoadLibrary is off,
// the node is not known by address (a cluster whose slots are not read yet), or it was tried
// less than noticeEvery ago. What happened is logged as library_loaded.
func (l *Limiter) loadLibrary(ctx context.Context, br *breaker) {
	s := l.selfLoad
	if s == nil {
		return
	}
	var c valkey.Client
	switch {
	case br.addr != "":
		c = l.vk.Nodes()[br.addr]
	case !l.breakers.cluster:
		c = l.vk
	}
	if c == nil {
		return
	}
	now := l.clock()
	s.mu.Lock()
	if last, ok := s.last[br]; ok && now-last < noticeEvery {
		s.mu.Unlock()
		return
	}
	s.last[br] = now
	s.mu.Unlock()
	go func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(2*l.deadline, time.Second))
		defer cancel()
		err := c.Do(lctx, c.B().FunctionLoad().FunctionCode(s.code).Build()).Error()
		switch {
		case err == nil:
			l.notes.say(lctx, slog.LevelWarn, noticeLibraryLoaded, br, l.nodeOf,
				"loaded the library this service embeds onto the node, which had none (Options.LoadLibrary): run `rlfn deploy` (or keep `rlfn reconcile` running) so that every node runs the release you chose")
		case strings.Contains(err.Error(), "already exists"):
			// Loaded by someone else since the call that found it missing: nothing to do.
		default:
			l.notes.say(lctx, slog.LevelError, noticeLibraryLoaded, br, l.nodeOf,
				"could not load the library onto the node, which has none (Options.LoadLibrary): its limits are decided by the fallback until `rlfn deploy` loads it",
				slog.String("cause", err.Error()))
		}
	}()
}
