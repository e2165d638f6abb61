package grpclimit

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
)

// A Decider that can do nothing else.
type allowOnly struct{ constant }

var bucket = client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}

// NewServer refuses options that cannot work with a *ConfigError naming the field, and
// returns no Server.
func TestNewServerRefuses(t *testing.T) {
	lim := &constant{}
	key := Metadata("x-key")
	for _, tt := range []struct {
		name string
		lim  Decider
		opts ServerOptions
		want string // the ConfigError's Field
	}{
		{"no limiter", nil, ServerOptions{Key: key}, "Limiter"},
		{"typed nil limiter", (*client.Limiter)(nil), ServerOptions{Key: key}, "Limiter"},
		{"no key", lim, ServerOptions{}, "Key"},
		{"negative delay", lim, ServerOptions{Key: key, MaxDelay: -1}, "MaxDelay"},
		{"unavailable", lim, ServerOptions{Key: key, ErrorCode: codes.Unavailable}, "ErrorCode"},
		{"no such code", lim, ServerOptions{Key: key, ErrorCode: 99}, "ErrorCode"},
		{"code and fail open", lim, ServerOptions{Key: key, ErrorCode: codes.Internal, FailOpen: true}, "ErrorCode"},
		{"method name", lim, ServerOptions{Key: key, Methods: map[string]Policy{"pkg.S/M": {Limit: bucket}}}, `Methods["pkg.S/M"]`},
		{"method name nested", lim, ServerOptions{Key: key, Methods: map[string]Policy{"/pkg.S/M/x": {Limit: bucket}}}, `Methods["/pkg.S/M/x"]`},
		{"policy name", lim, ServerOptions{Key: key, Methods: map[string]Policy{"/pkg.S/M": {Name: "a b", Limit: bucket}}}, `Methods["/pkg.S/M"]`},
		{"bad limit", lim, ServerOptions{Key: key, Default: Policy{Limit: client.TokenBucket{}}}, "Default"},
		{"percent", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, EnforcePercent: 101}}, "Default"},
		{"also without name", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, Also: []AlsoLimit{{Limit: bucket}}}}, "Default"},
		{"also of its name", lim, ServerOptions{Key: key, Default: Policy{Name: "a", Limit: bucket, Also: []AlsoLimit{{Name: "a", Limit: bucket}}}}, "Default"},
		{"unit", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, Unit: "to kens"}}, "Default"},
		{"no multi", &allowOnly{}, ServerOptions{Key: key, Default: Policy{Limit: bucket, Also: []AlsoLimit{{Name: "b", Limit: bucket}}}}, "Default"},
		{"cost, no multi", &allowOnly{}, ServerOptions{Key: key, Default: Policy{Limit: bucket, Cost: func(context.Context, string, any) int64 { return 2 }}}, "Default"},
		{"no acquirer", &allowOnly{}, ServerOptions{Key: key, Default: Policy{Concurrency: &client.Concurrency{Limit: 1, Lease: time.Second}}}, "Default"},
		{"no settler", &allowOnly{}, ServerOptions{Key: key, Default: Policy{Limit: bucket, Outcome: &Outcome{}}}, "Default"},
		{"trailer case", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, Outcome: &Outcome{CostTrailer: "Cost"}}}, "Default"},
		{"same key and a key", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, Also: []AlsoLimit{{Name: "b", Limit: bucket, SameKey: true, Key: Peer}}}}, "Default"},
		{"same key, one limiter", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, Also: []AlsoLimit{{Name: "b", Limit: bucket, SameKey: true}}}}, "Default"},
		{"no meterer", lim, ServerOptions{Key: key, Default: Policy{Limit: bucket, Meter: &StreamMeter{Units: func(any) int64 { return 1 }}}}, "Default"},
		{"check first alone", lim, ServerOptions{Key: key, Default: Policy{Concurrency: &client.Concurrency{Limit: 1, Lease: time.Second}, Outcome: &Outcome{CheckFirst: true}}}, "Default"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewServer(tt.lim, tt.opts)
			var ce *ConfigError
			if s != nil || !errors.As(err, &ce) || ce.Field != tt.want {
				t.Fatalf("NewServer = %v, %v; want a *ConfigError of %s", s, err, tt.want)
			}
		})
	}
}

// The policy of a method: its own, else its service's, else Default; nil when none limits.
func TestPolicyOf(t *testing.T) {
	s, err := NewServer(&constant{}, ServerOptions{Key: Peer, Methods: map[string]Policy{
		"/pkg.S/M":  {Name: "m", Limit: bucket},
		"/pkg.S/*":  {Name: "s", Limit: bucket},
		"/pkg.T/Up": {},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ give, want string }{
		{"/pkg.S/M", "m"}, {"/pkg.S/N", "s"}, {"/pkg.T/Up", ""}, {"/pkg.U/M", ""}, {"bad", ""},
	} {
		p := s.policy(tt.give)
		got := ""
		if p != nil {
			got = p.Name
		}
		if got != tt.want {
			t.Errorf("policy(%q) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

func TestSplitMethod(t *testing.T) {
	for _, tt := range []struct {
		give            string
		service, method string
		ok              bool
	}{
		{"/pkg.S/M", "pkg.S", "M", true},
		{"/S/*", "S", "*", true},
		{"pkg.S/M", "", "", false},
		{"/pkg.S", "", "", false},
		{"//M", "", "", false},
		{"/pkg.S/", "", "", false},
		{"/a/b/c", "", "", false},
	} {
		service, method, ok := splitMethod(tt.give)
		if ok != tt.ok || ok && (service != tt.service || method != tt.method) {
			t.Errorf("splitMethod(%q) = %q, %q, %v", tt.give, service, method, ok)
		}
	}
}

// A refusal, encoded by hand, decodes in a real client's status as the proto messages: the
// exact wait, the policy; a wait no time satisfies has no RetryInfo; a hidden quota no
// QuotaFailure and no policy in its message.
func TestRefusalDecodes(t *testing.T) {
	for _, tt := range []struct {
		name          string
		hide, blocked bool
		wait          time.Duration
		policy        string
	}{
		{"zero", false, false, 0, ""},
		// a name longer than the refusal's buffer: the status is built in an array of its own
		{"long name", false, true, time.Second, strings.Repeat("p", 400)},
		{"a millisecond", false, false, time.Millisecond, ""},
		{"seconds and nanos", false, false, 1500*time.Millisecond + 7, ""},
		{"hours", false, false, 3 * time.Hour, ""},
		{"never", false, false, client.Never, ""},
		{"hidden", true, false, 2 * time.Second, ""},
		{"blocked", false, true, time.Minute, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			policy := cmp.Or(tt.policy, "api-v1")
			err := refusal(tt.hide, tt.blocked, policy, tt.wait).err
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted {
				t.Fatalf("code %v", st.Code())
			}
			var retry *errdetails.RetryInfo
			var quota *errdetails.QuotaFailure
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.RetryInfo:
					retry = d
				case *errdetails.QuotaFailure:
					quota = d
				default:
					t.Fatalf("detail %v", d)
				}
			}
			if tt.wait == client.Never {
				if retry != nil {
					t.Errorf("RetryInfo %v for a wait that never admits", retry)
				}
			} else if retry == nil || retry.GetRetryDelay().AsDuration() != tt.wait {
				t.Errorf("RetryInfo %v, want %v", retry, tt.wait)
			}
			if tt.hide {
				if quota != nil || st.Message() != "grpclimit: rate limited" {
					t.Errorf("hidden: QuotaFailure %v, message %q", quota, st.Message())
				}
				return
			}
			v := quota.GetViolations()
			desc := "rate limit exceeded"
			if tt.blocked {
				desc = "blocked"
			}
			if len(v) != 1 || v[0].GetQuotaId() != policy || v[0].GetSubject() != "policy:"+policy || v[0].GetDescription() != desc {
				t.Errorf("QuotaFailure %v", quota)
			}
			msg := "grpclimit: rate limited by policy " + policy
			if tt.blocked {
				msg += ": blocked by a penalty for exceeding the quota or by an operator"
			}
			if st.Message() != msg {
				t.Errorf("message %q, want %q", st.Message(), msg)
			}
			if got, _ := RetryDelay(err); tt.wait != client.Never && got != tt.wait {
				t.Errorf("RetryDelay = %v, want %v", got, tt.wait)
			}
		})
	}
	if _, ok := RetryDelay(status.Error(codes.Unavailable, "x")); ok {
		t.Error("RetryDelay reads a status that is not ResourceExhausted")
	}
	if _, ok := RetryDelay(errors.New("x")); ok {
		t.Error("RetryDelay reads an error that is no status")
	}
}

func TestKeys(t *testing.T) {
	tcp := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 80}})
	if k, err := Peer(tcp, ""); k != "2001:db8::1" || err != nil {
		t.Errorf("Peer of a TCP address: %q, %v", k, err)
	}
	unix := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.UnixAddr{Name: "/run/s.sock", Net: "unix"}})
	if k, err := Peer(unix, ""); k != "/run/s.sock" || err != nil {
		t.Errorf("Peer of a unix address: %q, %v", k, err)
	}
	if _, err := Peer(context.Background(), ""); err == nil {
		t.Error("Peer of a call without a peer: no error")
	}
	md := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", "a", "x-key", "b"))
	if k, _ := Metadata("x-key")(md, ""); k != "b" {
		t.Errorf("Metadata = %q, want the last value", k)
	}
	if k, _ := Metadata("x-other")(md, ""); k != "" {
		t.Errorf("Metadata of an absent key = %q", k)
	}
	if _, err := TLSIdentity(tcp, ""); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("TLSIdentity without TLS: %v", err)
	}
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "billing"}}
	mtls := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{
		State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}})
	if k, err := TLSIdentity(mtls, ""); k != "billing" || err != nil {
		t.Errorf("TLSIdentity = %q, %v; want the subject's common name", k, err)
	}
	unverified := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{
		State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}})
	if _, err := TLSIdentity(unverified, ""); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("TLSIdentity of a certificate nobody verified: %v", err)
	}
}

// A key the call lacks refuses it InvalidArgument, before any decision; unless only shadow
// limits would need it, when it is served.
func TestMissingKey(t *testing.T) {
	var decided bool
	lim := &recording{decided: &decided}
	var reported []error
	s, err := NewServer(lim, ServerOptions{Key: Metadata("x-key"), Default: Policy{Limit: bucket},
		Methods: map[string]Policy{"/pkg.S/Shadow": {Name: "sh", Limit: bucket, Shadow: true}},
		OnError: func(_ context.Context, _ string, err error) { reported = append(reported, err) }})
	if err != nil {
		t.Fatal(err)
	}
	handler := func(context.Context, any) (any, error) { return "served", nil }
	_, err = s.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}, handler)
	if status.Code(err) != codes.InvalidArgument || decided {
		t.Errorf("no key: %v, decided %v; want InvalidArgument, no decision", err, decided)
	}
	resp, err := s.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/pkg.S/Shadow"}, handler)
	var ske *ShadowKeyError
	if resp != "served" || err != nil || len(reported) != 1 || !errors.As(reported[0], &ske) {
		t.Errorf("no key, shadow: %v, %v, reported %v; want served, a *ShadowKeyError", resp, err, reported)
	}
}

type recording struct {
	constant
	decided *bool
}

func (r *recording) Allow(ctx context.Context, key string, l client.Limit) (client.Result, error) {
	*r.decided = true
	return r.constant.Allow(ctx, key, l)
}

// The limiter's failure, the policy's mistake and a refused key are told apart: each has its
// code, and FailOpen serves only what the limiter could not decide.
func TestFailures(t *testing.T) {
	for _, tt := range []struct {
		name     string
		err      error
		failOpen bool
		want     codes.Code // OK: served
	}{
		{"down", errors.New("connection refused"), false, codes.Internal},
		{"down, fail open", errors.New("connection refused"), true, codes.OK},
		{"circuit", client.ErrCircuitOpen, false, codes.Internal},
		{"bad limit", &client.LimitError{Field: "x", Reason: "y"}, true, codes.Internal},
		{"foreign key", &client.LibraryError{Function: "rl_token_bucket", Message: "m"}, true, codes.Internal},
		{"key too long", &client.KeyError{Len: 600, Max: 512}, true, codes.InvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewServer(&failing{tt.err}, ServerOptions{Key: Metadata("x-key"), FailOpen: tt.failOpen,
				Default: Policy{Limit: bucket}, OnError: func(context.Context, string, error) {}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", "k"))
			_, err = s.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/p.S/M"}, func(context.Context, any) (any, error) { return nil, nil })
			if got := status.Code(err); got != tt.want || got == codes.Unavailable {
				t.Errorf("%v, want %v", err, tt.want)
			}
		})
	}
}

type failing struct{ err error }

func (f *failing) Allow(context.Context, string, client.Limit) (client.Result, error) {
	return client.Result{}, f.err
}

// versions is a Limiter whose nodes run release run.
type versions struct {
	constant
	run   string
	asked []string
}

func (v *versions) AllowAll(context.Context, []client.Rule) (client.Result, error) {
	return client.Result{}, nil
}

func (v *versions) CheckVersion(_ context.Context, min string) error {
	v.asked = append(v.asked, min)
	if min > v.run {
		return &client.VersionError{Node: "n1", Version: v.run, Want: min}
	}
	return nil
}

// Check asks for the newest release a policy needs first, and names the policies a node is too
// old for.
func TestCheck(t *testing.T) {
	lim := &versions{run: "1.0.0"}
	s, err := NewServer(lim, ServerOptions{Key: Peer,
		Methods: map[string]Policy{
			"/p.S/Month": {Name: "month", Limit: client.Calendar{Limit: 10, Period: client.Month}},
			"/p.S/Two":   {Name: "two", Limit: bucket, Also: []AlsoLimit{{Name: "b", Limit: bucket}}},
		},
		Default: Policy{Name: "plain", Limit: bucket}})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(context.Background())
	var re *ReleaseError
	if !errors.As(err, &re) || re.Release != "1.2.0" || len(re.Policies) != 1 || re.Policies[0] != "month" {
		t.Fatalf("Check = %v; want the month's policy needing 1.2.0 first", err)
	}
	if got := strings.Join(lim.asked, " "); got != "1.2.0 1.1.0 1.0.0" {
		t.Errorf("asked %s", got)
	}
	lim.run, lim.asked = "1.2.0", nil
	if err := s.Check(context.Background()); err != nil || len(lim.asked) != 1 {
		t.Errorf("Check on 1.2.0 = %v after asking %v; want nil after one question", err, lim.asked)
	}
	s, _ = NewServer(&constant{}, ServerOptions{Key: Peer})
	if err := s.Check(context.Background()); !errors.Is(err, ErrNoVersionChecker) {
		t.Errorf("Check without a VersionChecker = %v", err)
	}
}

// A refusal that says what a recent one said shares its status; one that differs in anything
// gets its own. Refusals of other waits keep theirs (a slot per wait).
func TestRefusalShared(t *testing.T) {
	s, err := NewServer(&constant{}, ServerOptions{Key: Peer})
	if err != nil {
		t.Fatal(err)
	}
	a := s.refuse(false, false, "api", time.Second)
	if b := s.refuse(false, false, "api", time.Second); b != a {
		t.Error("the same refusal built twice")
	}
	for _, b := range []error{
		s.refuse(false, false, "api", time.Second+time.Millisecond),
		s.refuse(true, false, "api", time.Second+time.Millisecond),
		s.refuse(true, true, "api", time.Second+time.Millisecond),
		s.refuse(true, true, "other", time.Second+time.Millisecond),
	} {
		if b == a {
			t.Fatal("a different refusal shares a status")
		}
		a = b
	}
	if d, _ := RetryDelay(a); d != time.Second+time.Millisecond {
		t.Errorf("RetryDelay %v", d)
	}
	x, y := s.refuse(false, false, "api", 2*time.Millisecond), s.refuse(false, false, "api", 3*time.Millisecond)
	if s.refuse(false, false, "api", 2*time.Millisecond) != x || s.refuse(false, false, "api", 3*time.Millisecond) != y {
		t.Error("two waits in turn do not keep their statuses")
	}
	// a slot holds one wait: the next wait of that slot replaces it
	z := s.refuse(false, false, "api", (2+refusalSlots)*time.Millisecond)
	if s.refuse(false, false, "api", 2*time.Millisecond) == x || z == x {
		t.Error("a slot held two waits")
	}
}

// A policy whose limits are all in shadow serves the call, with or without a lease to take.
func TestShadowOnlyServes(t *testing.T) {
	s, err := NewServer(&constant{res: client.Result{Limit: 1, RetryAfter: time.Second}}, ServerOptions{Key: Metadata("x-key"),
		Default: Policy{Name: "new", Limit: bucket, Shadow: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", "k"))
	resp, err := s.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/p.S/M"}, func(context.Context, any) (any, error) { return "served", nil })
	s.shadows.Wait()
	if resp != "served" || err != nil {
		t.Errorf("%v, %v; want served", resp, err)
	}
}

// rules is a MultiDecider that admits, recording the rules of its decisions.
type rules struct {
	constant
	got []client.Rule
}

func (r *rules) AllowAll(_ context.Context, rules []client.Rule) (client.Result, error) {
	r.got = rules
	return r.res, nil
}

// An AlsoLimit with SameKey is counted on the Policy's key, in the one decision with the
// Policy's Limit; one without keeps the key of its own, as before.
func TestSameKey(t *testing.T) {
	tokens := client.TokenBucket{Capacity: 150_000, Rate: 150_000, Period: time.Minute}
	lim := &rules{constant: constant{res: client.Result{Allowed: true, Limit: 60, Remaining: 59}}}
	s, err := NewServer(lim, ServerOptions{Key: Metadata("x-key"), Default: Policy{Name: "calls",
		Limit: client.SlidingWindow{Limit: 60, Window: time.Minute},
		Also: []AlsoLimit{
			{Name: "tokens", Limit: tokens, SameKey: true, Cost: func(context.Context, string, any) int64 { return 1200 }},
			{Name: "daily", Limit: client.FixedWindow{Limit: 5000, Window: 24 * time.Hour}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", "org7"))
	if _, err := s.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/p.S/M"}, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(lim.got))
	for i, r := range lim.got {
		got[i] = fmt.Sprint(r.Key, " ", r.Cost)
	}
	if want := "[calls:org7 0 calls:org7 1200 daily:org7 0]"; fmt.Sprint(got) != want {
		t.Errorf("rules %v, want %s", got, want)
	}
}
