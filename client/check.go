package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/versions"
)

// speaks is the major version of the library this client calls: that of the newest release
// it was built with.
var speaks = sync.OnceValue(func() string { return versions.Embedded().Latest().Major() })

// Check verifies that every primary the client knows runs a ratelimit library of the major
// version this client speaks. It returns nil, or one error per node that does not (a
// *VersionError, or the node's network error), joined with errors.Join and in address order.
// Replicas are not checked: they receive the library from their primary.
//
// A cluster client knows the primaries that own slots; a primary that owns none serves no
// calls yet, and is the deployer's to check.
func (l *Limiter) Check(ctx context.Context) error {
	nodes := l.vk.Nodes()
	if len(nodes) == 0 {
		return errors.New("rlfn: check: the client knows no node")
	}
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	slices.Sort(addrs)
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() { errs[i] = checkNode(ctx, addr, nodes[addr]) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func checkNode(ctx context.Context, addr string, c valkey.Client) error {
	res := c.DoMulti(ctx, c.B().Role().Build(), c.B().FcallRo().Function("rl_version").Numkeys(0).Build())
	role, err := res[0].ToArray()
	if err != nil {
		// A server error (ROLE refused by an ACL) leaves the role unknown: the node is
		// checked as a primary. A network error is the node's answer.
		if _, ok := valkey.IsValkeyErr(err); !ok {
			return fmt.Errorf("rlfn: node %s: %w", addr, err)
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
		return fmt.Errorf("rlfn: node %s: rl_version: %w", addr, err)
	}
	if !versions.Valid(v) || versions.Major(v) != want {
		return &VersionError{Node: addr, Version: v, Want: want}
	}
	return nil
}
