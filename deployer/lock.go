package deployer

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"
)

// LockKey is where the deploy lock lives unless Options.LockKey says otherwise.
const LockKey = "rlfn:deploy:lock"

var (
	//go:embed lock_renew.lua
	renewSource string
	//go:embed lock_release.lua
	releaseSource string

	// EVAL only, never EVALSHA: one command for a deploy-only ACL user to be granted.
	renewScript   = valkey.NewLuaScriptNoSha(renewSource)
	releaseScript = valkey.NewLuaScriptNoSha(releaseSource)
)

// lease is a held deploy lock.
type lease struct {
	c      valkey.Client
	key    string
	where  string // the node holding the key, for messages: host:port, or "the cluster"
	value  string
	ttl    time.Duration
	cancel context.CancelFunc // stops renewal
	done   chan struct{}
	// renewOnce runs the renew script once; tests replace it.
	renewOnce func(ctx context.Context) (int64, error)
}

// defaultOwner names this process for a deploy that finds the lock held.
func defaultOwner() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s pid %d", name, host, os.Getpid())
}

// acquire takes the lock with SET NX PX on c, which reaches the node `where`, or returns
// ErrLocked naming the holder. While it is held, the lease is renewed every third of its
// length; lost is called (once) if a renewal finds the lock gone or held by someone else,
// or no renewal succeeded for a whole lease.
func acquire(ctx context.Context, c valkey.Client, key, where, owner string, ttl time.Duration, lost func()) (*lease, error) {
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	value := owner + "|" + hex.EncodeToString(tok[:])
	err := c.Do(ctx, c.B().Set().Key(key).Value(value).Nx().Px(ttl).Build()).Error()
	if valkey.IsValkeyNil(err) {
		return nil, held(ctx, c, key, where)
	}
	if err != nil {
		return nil, fmt.Errorf("deployer: lock %s on %s: SET NX: %w", key, where, err)
	}
	l := &lease{c: c, key: key, where: where, value: value, ttl: ttl, done: make(chan struct{})}
	ms := strconv.FormatInt(ttl.Milliseconds(), 10)
	l.renewOnce = func(ctx context.Context) (int64, error) {
		return renewScript.Exec(ctx, c, []string{key}, []string{value, ms}).AsInt64()
	}
	l.start(ctx, lost)
	return l, nil
}

// start runs renewal until release.
func (l *lease) start(ctx context.Context, lost func()) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.cancel = cancel
	go l.renew(rctx, lost)
}

// held describes the lock's holder for ErrLocked.
func held(ctx context.Context, c valkey.Client, key, where string) error {
	res := c.DoMulti(ctx, c.B().Get().Key(key).Build(), c.B().Pttl().Key(key).Build())
	value, getErr := res[0].ToString()
	pttl, pttlErr := res[1].AsInt64()
	if pttlErr != nil {
		pttl = -3 // not known
	}
	return heldError(key, where, value, getErr, pttl)
}

// heldError says who holds the lock and how to get past it: wait for its lease, or, for a
// key no deploy will ever release (no expiry, or not a lock at all), delete it by hand.
// pttl is PTTL's answer: -1 no expiry, -2 no key, below that not known.
func heldError(key, where, value string, getErr error, pttl int64) error {
	del := fmt.Sprintf("DEL %s on %s", key, where)
	switch {
	case getErr != nil && valkey.IsValkeyNil(getErr):
		// Expired between SET NX and GET: say so rather than retry, the caller can.
		return fmt.Errorf("%w (%s on %s; it may just have been released: try again)", ErrLocked, key, where)
	case getErr != nil && strings.Contains(getErr.Error(), "WRONGTYPE"):
		return fmt.Errorf("%w: %s on %s is not a deploy lock (it holds another type of value); if nothing of yours uses that key, remove it (%s)",
			ErrLocked, key, where, del)
	case getErr != nil:
		return fmt.Errorf("%w (%s on %s; its holder could not be read: %v)", ErrLocked, key, where, getErr)
	}
	holder := value
	if i := strings.LastIndexByte(value, '|'); i > 0 {
		holder = value[:i]
	}
	if pttl == -1 {
		return fmt.Errorf("%w: held by %s with no expiry, so it is never released by itself (not set by a deploy, whose lock always has a lease); if no deploy is running, remove it: %s",
			ErrLocked, holder, del)
	}
	left := "an unknown time"
	if pttl >= 0 {
		left = (time.Duration(pttl) * time.Millisecond).String()
	}
	return fmt.Errorf("%w: held by %s, lease expires in %s (key %s on %s); wait for it, or if that deploy is dead and you cannot wait: %s",
		ErrLocked, holder, left, key, where, del)
}

func (l *lease) renew(ctx context.Context, lost func()) {
	defer close(l.done)
	var once sync.Once
	lose := func() { once.Do(lost) }
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// A renewal that hangs (a node that stopped answering) must not hold up the
		// next one, nor the check that the lease has run out.
		ectx, cancel := context.WithTimeout(ctx, l.ttl/3)
		n, err := l.renewOnce(ectx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && n == 1:
			last = time.Now()
		case err == nil:
			lose()
			return
		case time.Since(last) >= l.ttl:
			// Unreachable for a whole lease: another deploy may hold it by now.
			lose()
			return
		}
	}
}

// release stops renewal and deletes the lock if it is still ours.
func (l *lease) release(ctx context.Context) error {
	l.cancel()
	<-l.done
	if err := releaseScript.Exec(ctx, l.c, []string{l.key}, []string{l.value}).Error(); err != nil {
		return fmt.Errorf("deployer: release lock %s on %s (it expires by itself within %s): %w", l.key, l.where, l.ttl, err)
	}
	return nil
}

// ACLRules are the rules of an ACL user that can deploy and do nothing else, for
// ACL SETUSER <name> on ><password> ACLRules... (see the package doc for what each is for).
var ACLRules = []string{
	"resetkeys", "~" + LockKey, "resetchannels", "-@all",
	"+info", "+cluster|nodes",
	"+function|list", "+function|load", "+function|delete", "+fcall_ro",
	"+set", "+get", "+pttl", "+eval", "+pexpire", "+del",
}
