package decide

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

func TestOwed(t *testing.T) {
	r := func(cost int64) client.Rule { return client.Rule{Key: "k", Cost: cost} }
	for _, tt := range []struct {
		name       string
		rules      []client.Rule
		measured   []bool
		checkFirst bool
		counts     bool
		reported   int64
		ok         bool
		taken      string
		owed       string
	}{
		{"counts", []client.Rule{r(0)}, []bool{false}, false, true, 0, false, "[1]", "[1]"},
		{"does not count", []client.Rule{r(0)}, []bool{false}, false, false, 0, false, "[1]", "[0]"},
		{"check first, counts", []client.Rule{r(0)}, []bool{false}, true, true, 0, false, "[0]", "[1]"},
		{"check first, does not", []client.Rule{r(0)}, []bool{false}, true, false, 0, false, "[0]", "[0]"},
		{"reported, every limit measured (none has a Cost: Split.Metered)", []client.Rule{r(0), r(0)}, []bool{true, true}, false, true, 7, true, "[1 1]", "[7 7]"},
		{"reported, one measured: that one", []client.Rule{r(0), r(500)}, []bool{false, true}, false, true, 30, true, "[1 500]", "[1 30]"},
		{"reported, not counted", []client.Rule{r(0), r(500)}, []bool{false, true}, false, false, 30, true, "[1 500]", "[0 0]"},
		{"estimate stands without a report", []client.Rule{r(0), r(500)}, []bool{false, true}, false, true, 0, false, "[1 500]", "[1 500]"},
	} {
		taken, owed := Owed(tt.rules, tt.measured, tt.checkFirst, tt.counts, tt.reported, tt.ok)
		if fmt.Sprint(taken) != tt.taken || fmt.Sprint(owed) != tt.owed {
			t.Errorf("%s: taken %v owed %v, want %s %s", tt.name, taken, owed, tt.taken, tt.owed)
		}
	}
}

// settler records the calls a settlement makes; AllowN admits up to left.
type settler struct {
	calls []string
	left  int64
	err   error
}

func (s *settler) AllowN(_ context.Context, key string, _ client.Limit, n int64) (client.Result, error) {
	s.calls = append(s.calls, fmt.Sprintf("allow %s %d", key, n))
	if s.err != nil {
		return client.Result{}, s.err
	}
	if n > s.left {
		return client.Result{Remaining: s.left}, nil
	}
	s.left -= n
	return client.Result{Allowed: true, Remaining: s.left}, nil
}

func (s *settler) PeekN(_ context.Context, key string, _ client.Limit, n int64) (client.Result, error) {
	s.calls = append(s.calls, fmt.Sprintf("peek %s %d", key, n))
	return client.Result{Allowed: n <= s.left, Remaining: s.left}, nil
}

func (s *settler) Refund(_ context.Context, key string, _ client.Limit, n int64) (client.Result, error) {
	s.calls = append(s.calls, fmt.Sprintf("refund %s %d", key, n))
	return client.Result{}, s.err
}

// A settlement refunds what was taken beyond what is owed, charges what is owed beyond, takes
// what is left when the limit cannot hold the charge, and does nothing for a rule settled
// already; every rule's error is joined, none retried.
func TestSettle(t *testing.T) {
	rules := []client.Rule{{Key: "a"}, {Key: "b"}, {Key: "c"}}
	s := &settler{left: 10}
	if err := Settle(context.Background(), s, rules, []int64{1, 1, 5}, []int64{0, 1, 25}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.calls, "; "); got != "refund a 1; allow c 20; allow c 10" {
		t.Errorf("calls %s", got)
	}
	down := errors.New("down")
	s = &settler{err: down}
	err := Settle(context.Background(), s, rules, []int64{1, 1, 1}, []int64{0, 0, 1})
	if !errors.Is(err, down) || len(s.calls) != 2 {
		t.Errorf("%v after %v; want both refunds tried once, their errors joined", err, s.calls)
	}
}

// PeekAll peeks each rule's own cost and answers for the one that refuses with the longest
// wait, Never above all.
func TestPeekAll(t *testing.T) {
	lim := &waits{m: map[string]client.Result{
		"a": {Allowed: true, Remaining: 5},
		"b": {RetryAfter: time.Second},
		"c": {RetryAfter: client.Never},
		"d": {Allowed: true, Remaining: 2},
	}}
	for _, tt := range []struct {
		keys string
		want int
	}{{"ab", 1}, {"abc", 2}, {"cb", 0}, {"ad", 1}, {"a", 0}} {
		var rules []client.Rule
		for _, k := range tt.keys {
			rules = append(rules, client.Rule{Key: string(k), Cost: 3})
		}
		res, err := PeekAll(context.Background(), lim, rules)
		if err != nil || res.Rule != tt.want {
			t.Errorf("%s: rule %d, %v; want %d", tt.keys, res.Rule, err, tt.want)
		}
	}
	if lim.n != 3 {
		t.Errorf("peeked cost %d, want each rule's own, 3", lim.n)
	}
}

type waits struct {
	settler
	m map[string]client.Result
	n int64
}

func (w *waits) PeekN(_ context.Context, key string, _ client.Limit, n int64) (client.Result, error) {
	w.n = n
	return w.m[key], nil
}

func TestParseCost(t *testing.T) {
	for give, want := range map[string]int64{"0": 0, " 42 ": 42, "999999999999999": 999999999999999} {
		if got, ok := ParseCost(give); !ok || got != want {
			t.Errorf("ParseCost(%q) = %d, %v", give, got, ok)
		}
	}
	for _, give := range []string{"", "-1", "1e3", "1000000000000000", "x"} {
		if _, ok := ParseCost(give); ok {
			t.Errorf("ParseCost(%q) accepted", give)
		}
	}
}

// A limit's unit is its RateLimit-Policy item's qu; a unit or a name that needs escaping is
// refused.
func TestUnits(t *testing.T) {
	quotas := []Quota{{Name: "requests", Limit: client.FixedWindow{Limit: 60, Window: time.Minute}},
		{Name: "tokens", Limit: client.TokenBucket{Capacity: 150000, Rate: 150000, Period: time.Minute}, Unit: "tokens"}}
	now := func() int64 { return 1e18 }
	v := AppendValues(nil, Clock{Now: now, Wall: now}, ResetNone, quotas, client.Result{Allowed: true, Limit: 60, Remaining: 59}, nil, 0, false)
	if got := string(v.Buf[:v.Ends[0]]); got != `"requests";q=60;w=60, "tokens";q=150000;w=60;qu="tokens"` {
		t.Errorf("RateLimit-Policy %s", got)
	}
	none := func(int) Named { return Named{} }
	if _, reason := Check("api", `to"kens`, 0, 0, none); reason == "" {
		t.Error("a unit that needs escaping was accepted")
	}
	if bad, reason := Check("api", "", 0, 1, func(int) Named { return Named{Name: "b", Limit: quotas[0].Limit, Unit: "a b"} }); bad != "b" || reason == "" {
		t.Errorf("an AlsoLimit's bad unit: %q %q", bad, reason)
	}
}
