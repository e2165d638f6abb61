package decide

import (
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

// An operator's override (Result.Override) replaced the code's limit: the values describe the
// limit enforced, q and w, for the deciding limit and for the others of AllowAllEach.
func TestValuesOfOverrides(t *testing.T) {
	quotas := []Quota{{Name: "api", Limit: client.FixedWindow{Limit: 2, Window: time.Minute}},
		{Name: "burst", Limit: client.TokenBucket{Capacity: 5, Rate: 5, Period: time.Second}}}
	hourly := &client.Override{Key: "api:vip", Limit: client.FixedWindow{Limit: 50, Window: time.Hour}}
	bigger := &client.Override{Key: "burst:*", Limit: client.TokenBucket{Capacity: 100, Rate: 10, Period: time.Second}}
	now := func() int64 { return 1e18 }
	for _, tt := range []struct {
		name string
		res  client.Result
		each []client.Result
		want string
	}{
		{"none", client.Result{Allowed: true, Limit: 2, Remaining: 1}, nil, `"api";q=2;w=60, "burst";q=5;w=1`},
		{"the deciding limit's", client.Result{Allowed: true, Limit: 50, Remaining: 49, Override: hourly}, nil, `"api";q=50;w=3600, "burst";q=5;w=1`},
		{"each's", client.Result{Allowed: true, Limit: 50, Remaining: 49, Override: hourly},
			[]client.Result{{Allowed: true, Limit: 50, Remaining: 49, Override: hourly}, {Allowed: true, Limit: 100, Remaining: 99, Override: bigger}},
			`"api";q=50;w=3600, "burst";q=100;w=10`},
		{"a concurrency override has no limit here", client.Result{Allowed: true, Limit: 2, Remaining: 1, Override: &client.Override{Slots: 9}}, nil,
			`"api";q=2;w=60, "burst";q=5;w=1`},
	} {
		v := AppendValues(nil, Clock{Now: now, Wall: now}, ResetNone, quotas, tt.res, tt.each, 0, false)
		if got := string(v.Buf[:v.Ends[0]]); got != tt.want {
			t.Errorf("%s: RateLimit-Policy %s, want %s", tt.name, got, tt.want)
		}
	}
}
