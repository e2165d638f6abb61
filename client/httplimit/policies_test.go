package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

// A static policy that cannot be valid is refused by New, named, with what is wrong.
func TestNewRefusesPolicies(t *testing.T) {
	key := constKey("k")
	policy := func(*http.Request) Policy { return Policy{} }
	good := Policy{Name: "api", Limit: tokenBucket}
	tests := []struct {
		name       string
		lim        Decider
		give       []Policy
		wantField  string
		wantReason string
		wantLimit  bool // a *client.LimitError is in the chain
		wantErr    error
	}{
		{name: "a name with a space", give: []Policy{good, {Name: "my api", Limit: tokenBucket}},
			wantField: "Policies[1]", wantReason: `policy "my api": want letters`},
		{name: "a zero capacity", give: []Policy{{Name: "bucket", Limit: client.TokenBucket{Rate: 1, Period: time.Second}}},
			wantField: "Policies[0]", wantReason: `policy "bucket": Limit: TokenBucket.Capacity must be`, wantLimit: true},
		{name: "the default name, a bad limit", give: []Policy{{Limit: client.FixedWindow{Limit: 1}}},
			wantField: "Policies[0]", wantReason: `policy "default": Limit: FixedWindow.Window`, wantLimit: true},
		{name: "a nil pointer limit", give: []Policy{{Name: "p", Limit: (*client.TokenBucket)(nil)}},
			wantField: "Policies[0]", wantReason: "Limit: limit must not be nil", wantLimit: true},
		{name: "a rule without a name", give: []Policy{{Name: "p", Limit: tokenBucket, Also: []AlsoLimit{{Limit: hourly}}}},
			wantField: "Policies[0]", wantReason: "Also[0].Name is required"},
		{name: "a rule without a limit", give: []Policy{{Name: "p", Limit: tokenBucket, Also: []AlsoLimit{{Name: "r"}}}},
			wantField: "Policies[0]", wantReason: `policy "r": Limit is required`},
		{name: "a rule's bad limit", give: []Policy{{Name: "p", Limit: tokenBucket, Also: []AlsoLimit{{Name: "r", Limit: client.SlidingLog{Limit: 1}}}}},
			wantField: "Policies[0]", wantReason: `policy "r": Limit: SlidingLog.Window`, wantLimit: true},
		{name: "EnforcePercent 101", give: []Policy{{Name: "p", Limit: tokenBucket, EnforcePercent: 101}},
			wantField: "Policies[0]", wantReason: "EnforcePercent must be from 0 to 100, got 101"},
		{name: "a bad concurrency", give: []Policy{{Name: "p", Concurrency: &client.Concurrency{Limit: 1}}},
			wantField: "Policies[0]", wantReason: "Concurrency: Concurrency.Lease", wantLimit: true},
		{name: "several limits, no MultiDecider", lim: &constant{admits},
			give:      []Policy{{Name: "p", Limit: tokenBucket, Also: []AlsoLimit{{Name: "r", Limit: hourly}}}},
			wantField: "Policies[0]", wantErr: ErrNoMultiDecider},
		{name: "a route in shadow for some keys, no MultiDecider", lim: &constant{admits},
			give:      []Policy{{Name: "p", Limit: tokenBucket, EnforcePercent: 50, Also: []AlsoLimit{{Name: "r", Limit: hourly, Shadow: true}}}},
			wantField: "Policies[0]", wantErr: ErrNoMultiDecider},
		{name: "SameKey with a Key of its own", give: []Policy{{Name: "p", Limit: tokenBucket, Also: []AlsoLimit{{Name: "r", Limit: hourly, SameKey: true, Key: RemoteIP}}}},
			wantField: "Policies[0]", wantReason: `policy "r": SameKey counts the limit on the Policy's key: it cannot have a Key of its own`},
		{name: "SameKey, one limiter twice", give: []Policy{{Name: "p", Limit: tokenBucket, Also: []AlsoLimit{{Name: "r", Limit: tokenBucket, SameKey: true}}}},
			wantField: "Policies[0]", wantReason: `policy "r": SameKey: its Limit has the algorithm and Name of "p"'s on the Policy's key`},
		{name: "concurrency, no Acquirer", lim: &fake{},
			give:      []Policy{{Name: "p", Concurrency: &client.Concurrency{Limit: 1, Lease: time.Second}}},
			wantField: "Policies[0]", wantErr: ErrNoAcquirer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := tt.lim
			if lim == nil {
				lim = &fake{}
			}
			_, err := New(lim, Options{Key: key, Policy: policy, Policies: tt.give})
			var oe *ConfigError
			if !errors.As(err, &oe) || oe.Field != tt.wantField {
				t.Fatalf("got %v, want an *ConfigError for %s", err, tt.wantField)
			}
			if !strings.Contains(err.Error(), tt.wantReason) || !strings.HasPrefix(err.Error(), "httplimit: Options."+tt.wantField+" ") {
				t.Errorf("got %q, want it to hold %q", err, tt.wantReason)
			}
			var le *client.LimitError
			if errors.As(err, &le) != tt.wantLimit {
				t.Errorf("got %v: a *client.LimitError in it: %v, want %v", err, !tt.wantLimit, tt.wantLimit)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("got %v, want %v in it", err, tt.wantErr)
			}
		})
	}
	// what New accepts: a Limiter that serves every one of them
	ok := []Policy{
		good,
		{},
		{Name: "login", Limit: tokenBucket, Also: []AlsoLimit{{Name: "login-ip", Limit: hourly, Key: constKey("ip")}}},
		{Name: "pay", Limit: client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}, Concurrency: &client.Concurrency{Limit: 2, Lease: time.Second}},
	}
	if _, err := New(&checker{}, Options{Key: key, Policy: policy, Policies: ok}); err != nil {
		t.Errorf("New refuses valid policies: %v", err)
	}
	if _, err := New(&constant{admits}, Options{Key: key, Policy: policy, Policies: ok[:2]}); err != nil {
		t.Errorf("New refuses policies of one limit for a Limiter of Allow alone: %v", err)
	}
}

// tiered is a caller's type that is a client.Limit by a Calendar it embeds.
type tiered struct {
	client.Calendar
	Tier string
}

func TestNeeds(t *testing.T) {
	reserved := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second, Reserve: 2}
	lease := &client.Concurrency{Limit: 2, Lease: time.Second}
	tests := []struct {
		name string
		give Policy
		want string
	}{
		{"one limit", Policy{Limit: tokenBucket}, "1.0.0"},
		{"no limit", Policy{}, "1.0.0"},
		{"one limit with a reserve", Policy{Limit: reserved}, "1.1.0"},
		{"one limit, critical: still counted", Policy{Limit: reserved, Critical: true}, "1.1.0"},
		{"a concurrency", Policy{Concurrency: lease}, "1.1.0"},
		{"per user and per IP", Policy{Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey("ip")}}}, "1.1.0"},
		{"a rule alone", Policy{Also: []AlsoLimit{{Name: "ip", Limit: hourly}}}, "1.0.0"},
		{"one enforced, one shadow: each decided alone", Policy{Limit: tokenBucket, Also: []AlsoLimit{{Name: "h", Limit: hourly, Shadow: true}}}, "1.0.0"},
		{"two shadow rules: decided at once", Policy{Limit: tokenBucket, Also: []AlsoLimit{{Name: "h", Limit: hourly, Shadow: true}, {Name: "d", Limit: daily, Shadow: true}}}, "1.1.0"},
		{"a route in shadow", Policy{Limit: tokenBucket, Shadow: true, Also: []AlsoLimit{{Name: "h", Limit: hourly}}}, "1.1.0"},
		{"the dial below 100: all in shadow for some keys", Policy{Limit: tokenBucket, EnforcePercent: 50, Also: []AlsoLimit{{Name: "h", Limit: hourly, Shadow: true}}}, "1.1.0"},
		{"the dial at 100", Policy{Limit: tokenBucket, EnforcePercent: 100, Also: []AlsoLimit{{Name: "h", Limit: hourly, Shadow: true}}}, "1.0.0"},
		{"a calendar", Policy{Limit: monthly}, "1.2.0"},
		{"a pointer to a calendar", Policy{Limit: &monthly}, "1.2.0"},
		{"a calendar embedded in a caller's type", Policy{Limit: tiered{Calendar: monthly}}, "1.2.0"},
		{"a penalty", Policy{Limit: client.FixedWindow{Limit: 5, Window: time.Minute, Penalty: time.Hour}}, "1.2.0"},
		{"a penalty on a pointer", Policy{Limit: &client.SlidingLog{Limit: 5, Window: time.Minute, Penalty: time.Second}}, "1.2.0"},
		{"a penalty in a caller's type", Policy{Limit: struct{ client.TokenBucket }{client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second, Penalty: time.Minute}}}, "1.2.0"},
		{"a calendar in an AlsoLimit", Policy{Limit: tokenBucket, Also: []AlsoLimit{{Name: "m", Limit: monthly}}}, "1.2.0"},
		{"a calendar in shadow", Policy{Limit: tokenBucket, Also: []AlsoLimit{{Name: "m", Limit: monthly, Shadow: true}}}, "1.2.0"},
		{"a penalty beside a concurrency", Policy{Concurrency: lease, Limit: client.LeakyBucket{Capacity: 1, Rate: 1, Period: time.Second, Penalty: time.Minute}}, "1.2.0"},
		{"a penalty of 0 is none", Policy{Limit: client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Second}}, "1.0.0"},
		{"a nil pointer", Policy{Limit: (*client.FixedWindow)(nil)}, "1.0.0"},
	}
	for _, tt := range tests {
		if got := Needs(tt.give); got != tt.want {
			t.Errorf("%s: Needs = %s, want %s", tt.name, got, tt.want)
		}
	}
}

// checker is a fake that takes leases and checks versions: every node runs version.
type checker struct {
	fake
	version string
	err     error // the nodes' error, when not about the version

	mu   sync.Mutex
	mins []string
}

func (c *checker) Acquire(context.Context, string, client.Concurrency) (*client.Lease, client.Result, error) {
	return nil, client.Result{}, errors.New("no lease in this fake")
}

func (c *checker) CheckVersion(_ context.Context, min string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mins = append(c.mins, min)
	switch {
	case c.err != nil:
		return c.err
	case min != "" && c.version < min: // the versions of these tests compare as strings
		return &client.VersionError{Node: "127.0.0.1:6379", Version: c.version, Want: min}
	}
	return nil
}

// Check asks the nodes for the newest release the policies need, then, when some node lacks
// it, for the older ones, and names the policies of each release a node lacks.
func TestCheck(t *testing.T) {
	one := Policy{Name: "api", Limit: tokenBucket}
	two := Policy{Name: "user-ip", Limit: tokenBucket, Also: []AlsoLimit{{Name: "ip", Limit: hourly, Key: constKey("ip")}}}
	lease := Policy{Name: "pay", Concurrency: &client.Concurrency{Limit: 2, Lease: time.Second}}
	cal := Policy{Name: "monthly", Limit: monthly}
	pen := Policy{Name: "login", Limit: tokenBucket, Also: []AlsoLimit{{Name: "login-ip", Limit: penalized, Key: constKey("ip")}}}
	down := errors.New("client: node 127.0.0.1:6379: connection refused")
	tests := []struct {
		name     string
		version  string
		err      error
		policies []Policy
		wantMins []string
		want     map[string][]string // release -> policies a *ReleaseError names
	}{
		{name: "no policies: the major version", version: "1.0.0", wantMins: []string{""}},
		{name: "a route without limits: the major version", version: "1.0.0", policies: []Policy{{Name: "health"}}, wantMins: []string{""}},
		{name: "1.1.0 runs everything", version: "1.1.0", policies: []Policy{one, two, lease}, wantMins: []string{"1.1.0"}},
		{name: "1.0.0 under policies of one limit", version: "1.0.0", policies: []Policy{one, {Name: "health"}, {Name: "other", Limit: hourly}}, wantMins: []string{"1.0.0"}},
		{name: "1.0.0 under several limits", version: "1.0.0", policies: []Policy{one, two, lease},
			wantMins: []string{"1.1.0", "1.0.0"}, want: map[string][]string{"1.1.0": {"user-ip", "pay"}}},
		{name: "no library", version: "", policies: []Policy{one, two},
			wantMins: []string{"1.1.0", "1.0.0"}, want: map[string][]string{"1.1.0": {"user-ip"}, "1.0.0": {"api"}}},
		{name: "1.2.0 runs calendars and penalties", version: "1.2.0", policies: []Policy{one, two, cal, pen},
			wantMins: []string{"1.2.0"}},
		{name: "1.1.0 under a calendar and a penalty", version: "1.1.0", policies: []Policy{one, cal, two, pen},
			wantMins: []string{"1.2.0", "1.1.0"}, want: map[string][]string{"1.2.0": {"monthly", "login"}}},
		{name: "1.0.0 under every release", version: "1.0.0", policies: []Policy{one, cal, two},
			wantMins: []string{"1.2.0", "1.1.0", "1.0.0"}, want: map[string][]string{"1.2.0": {"monthly"}, "1.1.0": {"user-ip"}}},
		{name: "the nodes unreachable", err: down, policies: []Policy{two},
			wantMins: []string{"1.1.0"}, want: map[string][]string{"1.1.0": {"user-ip"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &checker{version: tt.version, err: tt.err}
			m := mustNew(t, lim, Options{Policies: tt.policies})
			err := m.Check(context.Background())
			if !slices.Equal(lim.mins, tt.wantMins) {
				t.Errorf("CheckVersion asked for %q, want %q", lim.mins, tt.wantMins)
			}
			got := map[string][]string{}
			for _, e := range unjoin(err) {
				var re *ReleaseError
				if !errors.As(e, &re) {
					t.Fatalf("Check: %v, want *ReleaseErrors", err)
				}
				got[re.Release] = re.Policies
				var ve *client.VersionError
				if tt.err == nil && (!errors.As(e, &ve) || ve.Want != re.Release) {
					t.Errorf("%v: no *client.VersionError wanting %s in it", e, re.Release)
				}
				if !strings.HasPrefix(e.Error(), "httplimit: policies ") {
					t.Errorf("%q: want it to name the policies", e)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Check: %v, want errors for %v", err, tt.want)
			}
			for rel, names := range tt.want {
				if !slices.Equal(got[rel], names) {
					t.Errorf("release %s: policies %q, want %q", rel, got[rel], names)
				}
			}
		})
	}
	if err := mustNew(t, &fake{}, Options{}).Check(context.Background()); err != ErrNoVersionChecker {
		t.Errorf("Check of a Limiter that cannot tell: %v, want ErrNoVersionChecker", err)
	}
}

// unjoin is the errors errors.Join joined, or err alone.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// LimiterKey is the key the middleware decides each limit on, so that an operator's Block of
// it is the block the route obeys.
func TestLimiterKey(t *testing.T) {
	lim := &fake{res: client.Result{Allowed: true, Limit: 5, Remaining: 4}}
	m := mustNew(t, lim, Options{
		Key: constKey("k"),
		Policy: func(*http.Request) Policy {
			return Policy{Limit: penalized, Also: []AlsoLimit{{Name: "a", Limit: hourly}, {Name: "b", Limit: daily, Key: constKey("ip")}}}
		},
		Now: now, // TestCoarseClock starts the coarse clock itself
	})
	m.Handler(served).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	want := []string{LimiterKey("", "k"), LimiterKey("a", "k"), LimiterKey("b", "ip")}
	var got []string
	for _, c := range lim.calls {
		got = append(got, c.key)
	}
	if !slices.Equal(got, want) || want[0] != "default:k" {
		t.Errorf("decided on %q, LimiterKey says %q", got, want)
	}
}
