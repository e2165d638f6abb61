package decide

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/rlfn/rlfn/client"
)

// CheckNear reports why a policy's NearLimit cannot be used, or "".
func CheckNear(near float64) string {
	if near < 0 || near > 1 || near != near {
		return fmt.Sprintf("NearLimit must be from 0 (off) to 1, got %v", near)
	}
	return ""
}

// Near reports whether res, admitted, leaves its limit used at least the share near of it
// (0: never): the soft limit a policy warns at before its limit refuses.
func Near(res client.Result, near float64) bool {
	if near <= 0 || !res.Allowed || res.Limit <= 0 {
		return false
	}
	return float64(res.Limit-res.Remaining) >= near*float64(res.Limit)
}

// PolicyCounter adds to a counter by rlfn.policy, with each policy's attribute set made once,
// for at most maxThrottles policies: a policy function may make its names up per call, and
// those beyond share the policy "_overflow".
type PolicyCounter struct {
	c    metric.Int64Counter
	sets sync.Map // policy name -> []metric.AddOption
	n    atomic.Int64
}

// NewPolicyCounter makes the counter name of mp's meter scope.
func NewPolicyCounter(mp metric.MeterProvider, scope, name, unit, description string) (*PolicyCounter, error) {
	c, err := mp.Meter(scope).Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(description))
	if err != nil {
		return nil, err
	}
	return &PolicyCounter{c: c}, nil
}

// Add adds 1 for policy; a nil counter counts nothing.
func (pc *PolicyCounter) Add(ctx context.Context, policy string) {
	if pc == nil {
		return
	}
	if v, ok := pc.sets.Load(policy); ok {
		pc.c.Add(ctx, 1, v.([]metric.AddOption)...)
		return
	}
	if pc.n.Load() >= maxThrottles {
		policy = "_overflow"
	}
	opts := []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("rlfn.policy", policy)))}
	v, loaded := pc.sets.LoadOrStore(policy, opts)
	if !loaded {
		pc.n.Add(1)
	}
	pc.c.Add(ctx, 1, v.([]metric.AddOption)...)
}
