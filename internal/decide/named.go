package decide

import (
	"context"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/limitname"
)

// The calls of a *client.Limiter named by their limit's name as an argument (internal/limitname):
// a middleware names every decision by its policy, or by a further limit's name, and a context
// of client.WithLimitName's would cost each request an allocation. A Decider of the service's
// own is called as its interface says, unnamed.
var (
	allowN  = limitname.AllowN.(func(*client.Limiter, context.Context, string, string, client.Limit, int64) (client.Result, error))
	peekN   = limitname.PeekN.(func(*client.Limiter, context.Context, string, string, client.Limit, int64) (client.Result, error))
	refund  = limitname.Refund.(func(*client.Limiter, context.Context, string, string, client.Limit, int64) (client.Result, error))
	acquire = limitname.Acquire.(func(*client.Limiter, context.Context, string, string, client.Concurrency) (*client.Lease, client.Result, error))
)

// Allow is lim.Allow of the limit named name.
func Allow(ctx context.Context, lim Decider, name, key string, l client.Limit) (client.Result, error) {
	if cl, ok := lim.(*client.Limiter); ok {
		return allowN(cl, ctx, name, key, l, 1)
	}
	return lim.Allow(ctx, key, l)
}

// AllowN is lim.AllowN of the limit named name.
func AllowN(ctx context.Context, lim Settler, name, key string, l client.Limit, n int64) (client.Result, error) {
	if cl, ok := lim.(*client.Limiter); ok {
		return allowN(cl, ctx, name, key, l, n)
	}
	return lim.AllowN(ctx, key, l, n)
}

// PeekN is lim.PeekN of the limit named name.
func PeekN(ctx context.Context, lim Settler, name, key string, l client.Limit, n int64) (client.Result, error) {
	if cl, ok := lim.(*client.Limiter); ok {
		return peekN(cl, ctx, name, key, l, n)
	}
	return lim.PeekN(ctx, key, l, n)
}

// Refund is lim.Refund of the limit named name.
func Refund(ctx context.Context, lim Settler, name, key string, l client.Limit, n int64) (client.Result, error) {
	if cl, ok := lim.(*client.Limiter); ok {
		return refund(cl, ctx, name, key, l, n)
	}
	return lim.Refund(ctx, key, l, n)
}

// Acquire is lim.Acquire of the concurrency limit named name (its lease's renewals and
// release keep the name).
func Acquire(ctx context.Context, lim Acquirer, name, key string, c client.Concurrency) (*client.Lease, client.Result, error) {
	if cl, ok := lim.(*client.Limiter); ok {
		return acquire(cl, ctx, name, key, c)
	}
	return lim.Acquire(ctx, key, c)
}
