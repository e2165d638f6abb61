package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/internal/needs"
	"github.com/rlfn/rlfn/versions"
)

// speaks is the major version of the library this client calls: that of the newest release
// it was built with.
var speaks = sync.OnceValue(func() string { return versions.Embedded().Latest().Major() })

// versionCommand is FCALL_RO rl_version, the one way the client asks a node for its library's
// version.
func versionCommand(c valkey.Client) valkey.Completed {
	return c.B().FcallRo().Function("rl_version").Numkeys(0).Build()
}

// Check verifies that every primary the client knows runs a ratelimit library of the major
// version this client speaks. It returns nil, or one error per node that does not (a
// *VersionError, or the node's network error), joined with errors.Join and in address order.
// Replicas are not checked: they receive the library from their primary.
//
// A cluster client knows the primaries that own slots; a primary that owns none serves no
// calls yet, and is the deployer's to check.
func (l *Limiter) Check(ctx context.Context) error {
	return l.CheckVersion(ctx, "")
}

// CheckVersion is Check that also requires min or later on every primary, e.g. "1.1.0"
// before using Reserve, Refund, Acquire or AllowAll (CheckRules finds which a service's
// limits need); an empty min requires only the major
// version. A node that runs an older version is a *VersionError with Want = min.
func (l *Limiter) CheckVersion(ctx context.Context, min string) error {
	if min != "" && !versions.Valid(min) {
		return fmt.Errorf("client: check: %q is not a version", min)
	}
	nodes := l.vk.Nodes()
	if len(nodes) == 0 {
		return errors.New("client: check: the client knows no node")
	}
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	slices.Sort(addrs)
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() { errs[i] = safely(addr, func() error { return checkNode(ctx, addr, nodes[addr], min) }) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// CheckRules validates rules (as AllowAll would, keys included) and verifies that every primary
// runs the library release they need: 1.2.0 for a Calendar or a Penalty, 1.1.0 for several
// rules or a Reserve, else 1.0.0 (Acquire, Refund and a Concurrency limit need 1.1.0 too). It is the check at start-up of a
// service whose limits are known then, so that it learns of a node still on 1.0.0 before its
// first request. A *LimitError or *KeyError is returned as it is; the nodes' errors as from
// CheckVersion.
//
// A decision never stops limiting for lack of a release: a node that cannot decide a limit
// leaves it to the Fallback, and one that cannot refund decides AllowAll's rules one at a time
// (see AllowAllN). CheckRules says when that would happen.
func (l *Limiter) CheckRules(ctx context.Context, rules ...Rule) error {
	if _, err := l.groupRules(ctx, rules, 1); err != nil {
		return err
	}
	reserved, v12 := false, false
	for _, r := range rules {
		s := r.Limit.spec()
		reserved = reserved || s.reserve > 0
		v12 = v12 || wants(opAllow, call{spec: s}) == needs.V12
	}
	if v12 {
		return l.CheckVersion(ctx, needs.V12)
	}
	return l.CheckVersion(ctx, needs.Release(len(rules), reserved))
}

// safely runs f, a node's part of a check, and turns its panic (a node client's bug) into the
// node's error: a panic in a goroutine of the Limiter's own would end the service, and no
// caller could recover it.
func safely(addr string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(addr, r)
		}
	}()
	return f()
}

func panicError(addr string, r any) error {
	return fmt.Errorf("client: node %s: panic: %v", addr, r)
}

func checkNode(ctx context.Context, addr string, c valkey.Client, min string) error {
	res := c.DoMulti(ctx, c.B().Role().Build(), versionCommand(c))
	role, err := res[0].ToArray()
	if err != nil {
		// A server error (ROLE refused by an ACL) leaves the role unknown: the node is
		// checked as a primary. A network error is the node's answer.
		if _, ok := valkey.IsValkeyErr(err); !ok {
			return fmt.Errorf("client: node %s: %w", addr, err)
		}
	} else if len(role) > 0 {
		if r, _ := role[0].ToString(); r == "slave" || r == "replica" {
			return nil
		}
	}
	want := speaks()
	v, err := res[1].ToString()
	if err != nil {
		if verr, ok := valkey.IsValkeyErr(err); ok && notFound(verr.Error()) {
			return &VersionError{Node: addr, Want: want}
		}
		return fmt.Errorf("client: node %s: rl_version: %w", addr, err)
	}
	if !versions.Valid(v) || versions.Major(v) != want {
		return &VersionError{Node: addr, Version: v, Want: want}
	}
	if min != "" && versions.Compare(v, min) < 0 {
		return &VersionError{Node: addr, Version: v, Want: min}
	}
	return nil
}

// olderLibrary reports the errors an older library answers a newer call with: "Function not
// found" for a function it does not have, RLERR "... takes 3 arguments ..." for a trailing
// reserve (1.0), RLERR "... unknown algorithm ..." for an rl_multi group it does not know
// (a 1.1 node asked for a 1.2 calendar or block group, a 1.2 node for a 1.3 hold group), and
// RLERR "rl_multi: 2 groups take 10 arguments, got 11" for rl_multi's replies (1.2). Any of
// them from a node that runs the release the call needs is its own error (versionError).
func olderLibrary(err error) bool {
	var le *LibraryError
	return errors.Is(err, ErrNotLoaded) || errors.As(err, &le) &&
		(strings.Contains(le.Message, " takes ") || strings.Contains(le.Message, "unknown algorithm") ||
			strings.Contains(le.Message, " groups take "))
}

// versionError finds out why fn failed with err, an answer an older library would give (one
// older than want): it asks
// every node the client knows, at once, for rl_version, with EXISTS key before it, which in a
// cluster only the owner of key's slot answers (the others redirect), so that the node named
// is the one that served the call. It returns a *VersionError for a node older than
// want (or, without the library, one that is errors.Is ErrNotLoaded); err itself when
// every answering node runs want or later (the call's own error stands). When no node
// answers, an RLERR about arguments still says that an older library refused the call, not
// that the limit was bad: it becomes a *replyError, which the Fallback decides.
func (l *Limiter) versionError(ctx context.Context, fn, key, want string, err error) error {
	nodes := l.vk.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	slices.Sort(addrs)
	type answer struct {
		version  string
		answered bool  // the node owns key (or is not a cluster node) and answered rl_version
		absent   bool  // it has no library
		err      error // why it did not answer
	}
	answers := make([]answer, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					answers[i].err = panicError(addr, r)
				}
			}()
			c := nodes[addr]
			res := c.DoMulti(ctx, c.B().Exists().Key(key).Build(), versionCommand(c))
			if err := res[0].Error(); err != nil {
				if _, ok := valkey.IsValkeyErr(err); ok && isRedirect(err.Error()) {
					return
				}
			}
			a := &answers[i]
			v, err := res[1].ToString()
			switch verr, ok := valkey.IsValkeyErr(err); {
			case err == nil:
				a.version, a.answered = v, true
			case ok && notFound(verr.Error()):
				a.absent, a.answered = true, true
			default:
				a.err = err
			}
		})
	}
	wg.Wait()
	var absent error
	answered := false
	var lookupErr error
	for i, a := range answers {
		answered = answered || a.answered
		lookupErr = cmp.Or(lookupErr, a.err)
		switch {
		case a.absent && absent == nil:
			absent = &VersionError{Node: addrs[i], Want: want, Function: fn}
		case a.answered && versions.Valid(a.version) && versions.Compare(a.version, want) < 0:
			return &VersionError{Node: addrs[i], Version: a.version, Want: want, Function: fn}
		}
	}
	if absent != nil {
		return absent
	}
	var le *LibraryError
	if !answered && errors.As(err, &le) {
		reason := "RLERR " + le.Message + ": an older library's answer, and no node told its version"
		if lookupErr != nil {
			reason += " (" + lookupErr.Error() + ")"
		}
		return &replyError{Function: fn, Reason: reason}
	}
	return err
}

// isRedirect reports a cluster's answer about a key another node owns.
func isRedirect(msg string) bool {
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}
