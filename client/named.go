package client

import (
	"context"

	"github.com/rlfn/rlfn/internal/limitname"
)

// named.go: the calls httplimit and grpclimit make, named by their policy (or a further
// limit's name) as an argument rather than by WithLimitName's context, which would cost each
// of their requests an allocation. The name goes where Rule.Name goes: into the call's spec,
// which metrics, spans and log lines read (nameOf).

func init() {
	limitname.AllowN = func(l *Limiter, ctx context.Context, name, key string, limit Limit, n int64) (Result, error) {
		return l.allowN(ctx, name, key, limit, n)
	}
	limitname.PeekN = func(l *Limiter, ctx context.Context, name, key string, limit Limit, n int64) (Result, error) {
		return l.peekN(ctx, name, key, limit, n)
	}
	limitname.Refund = func(l *Limiter, ctx context.Context, name, key string, limit Limit, n int64) (Result, error) {
		return l.refund(ctx, name, key, limit, n)
	}
	limitname.Acquire = func(l *Limiter, ctx context.Context, name, key string, c Concurrency) (*Lease, Result, error) {
		return l.acquire(ctx, name, key, c)
	}
}
