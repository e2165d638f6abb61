package llmlimit

import (
	"context"

	"github.com/rlfn/rlfn/client"
)

// New returns a Middleware that holds, meters and settles each request on lim's server
// (library 1.3.0: client.Limiter.Meter, or Limiter.Hold when no limit counts output tokens).
func New(lim *client.Limiter, opts Options) (*Middleware, error) {
	if lim == nil {
		return nil, &ConfigError{Field: "Limiter", Reason: "is required"}
	}
	return newMiddleware(limiter{lim}, opts)
}

// limiter opens meters on a *client.Limiter.
type limiter struct{ l *client.Limiter }

func (l limiter) open(ctx context.Context, rules []client.Rule, spec meterSpec) (meter, client.Result, []client.Result, error) {
	// Keep: a hold whose process died before it settled stays charged at what it held, so a
	// crash never gives a stream's tokens back for free.
	hold := client.HoldOptions{TTL: spec.ttl, Keep: true}
	metered := false
	for _, p := range spec.perUnit {
		metered = metered || p > 0
	}
	if !metered {
		// No limit counts output tokens (requests and input alone): nothing to meter.
		h, res, each, err := l.l.HoldEach(ctx, rules, hold)
		if err != nil || !res.Allowed {
			return nil, res, each, err
		}
		return heldOnly{h}, res, each, nil
	}
	m, res, each, err := l.l.MeterEach(ctx, rules, client.MeterOptions{Hold: hold, PerUnit: spec.perUnit, Base: spec.base})
	if err != nil || !res.Allowed {
		return nil, res, each, err
	}
	return m, res, each, nil
}

// heldOnly is a request's hold when nothing is metered: every token is granted.
type heldOnly struct{ h *client.Hold }

func (h heldOnly) Take(context.Context, int64) (bool, error) { return true, nil }

func (h heldOnly) Result() client.Result { return client.Result{Allowed: true} }

func (h heldOnly) Settle(ctx context.Context, actual []int64) (client.Result, error) {
	return h.h.Settle(ctx, actual)
}
