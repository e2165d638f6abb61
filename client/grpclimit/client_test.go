package grpclimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/rlfn/rlfn/client"
)

// fakeClock is a clock that moves only when slept on.
type fakeClock struct {
	now   time.Time
	slept []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.slept = append(c.slept, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

// invoker answers a refusal with a RetryInfo of wait, refused times, then succeeds.
func invoker(refused int, wait time.Duration, calls *int) grpc.UnaryInvoker {
	return func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		*calls++
		if *calls <= refused {
			return refusal(false, false, "api", wait).err
		}
		return nil
	}
}

// Retries: only for a method safe to repeat, after the server's wait plus at most Jitter of
// it, never past the deadline or MaxWait, at most MaxRetries times; another code is never
// retried.
func TestClientRetries(t *testing.T) {
	idem := func(m string) bool { return m == "/p.S/Get" }
	for _, tt := range []struct {
		name      string
		method    string
		refused   int
		wait      time.Duration
		deadline  time.Duration // 0: none
		retries   int
		rand      float64
		wantCalls int
		wantSlept []time.Duration
		wantCode  codes.Code
	}{
		{"not idempotent", "/p.S/Post", 1, time.Second, 0, 0, 0, 1, nil, codes.ResourceExhausted},
		{"idempotent", "/p.S/Get", 1, time.Second, 0, 0, 0, 2, []time.Duration{time.Second}, codes.OK},
		{"jitter", "/p.S/Get", 1, time.Second, 0, 0, 1, 2, []time.Duration{1200 * time.Millisecond}, codes.OK},
		{"jitter cut at the deadline", "/p.S/Get", 1, time.Second, 1100 * time.Millisecond, 0, 1, 2, []time.Duration{1100 * time.Millisecond}, codes.OK},
		{"past the deadline", "/p.S/Get", 1, time.Second, 900 * time.Millisecond, 0, 0, 1, nil, codes.ResourceExhausted},
		{"past MaxWait", "/p.S/Get", 1, 2 * time.Minute, 0, 0, 0, 1, nil, codes.ResourceExhausted},
		{"retries run out", "/p.S/Get", 5, time.Second, 0, 2, 0, 3, []time.Duration{time.Second, time.Second}, codes.ResourceExhausted},
		{"no retries", "/p.S/Get", 1, time.Second, 0, -1, 0, 1, nil, codes.ResourceExhausted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Now()} // the deadline is the real clock's
			c, err := NewClient(nil, ClientOptions{Idempotent: idem, MaxRetries: tt.retries,
				Now: clock.Now, Sleep: clock.Sleep, Rand: func() float64 { return tt.rand }})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, clock.now.Add(tt.deadline))
				defer cancel()
			}
			calls := 0
			err = c.unary(ctx, tt.method, nil, nil, nil, invoker(tt.refused, tt.wait, &calls))
			if status.Code(err) != tt.wantCode || calls != tt.wantCalls || len(clock.slept) != len(tt.wantSlept) {
				t.Fatalf("%v after %d calls, slept %v; want %v after %d, slept %v", err, calls, clock.slept, tt.wantCode, tt.wantCalls, tt.wantSlept)
			}
			for i, d := range tt.wantSlept {
				if clock.slept[i] != d {
					t.Errorf("slept %v, want %v", clock.slept, tt.wantSlept)
				}
			}
		})
	}
	// Another code than ResourceExhausted, even with a RetryInfo's wait, is not retried.
	c, _ := NewClient(nil, ClientOptions{Idempotent: idem})
	calls := 0
	err := c.unary(context.Background(), "/p.S/Get", nil, nil, nil, func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		calls++
		return status.Error(codes.Unavailable, "down")
	})
	if calls != 1 || status.Code(err) != codes.Unavailable {
		t.Errorf("Unavailable: %d calls, %v", calls, err)
	}
}

// Pacing: a call the limiter refuses waits its RetryAfter; a wait that can never end, or ends
// past MaxWait, fails it unsent with a *WaitError, ResourceExhausted.
func TestClientPaces(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	lim := &sequence{results: []client.Result{{RetryAfter: 300 * time.Millisecond}, {Allowed: true}}}
	c, err := NewClient(lim, ClientOptions{Limit: bucket, Key: func(context.Context, string) (string, error) { return "k", nil },
		Now: clock.Now, Sleep: clock.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	if err := c.unary(context.Background(), "/p.S/M", nil, nil, nil, invoker(0, 0, &calls)); err != nil || calls != 1 ||
		len(clock.slept) != 1 || clock.slept[0] != 300*time.Millisecond {
		t.Fatalf("%v, %d calls, slept %v; want one call after 300ms", err, calls, clock.slept)
	}
	for _, res := range []client.Result{{RetryAfter: client.Never}, {RetryAfter: 2 * time.Minute}} {
		lim.results = []client.Result{res}
		_, err := c.stream(context.Background(), nil, nil, "/p.S/M", func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
			t.Fatal("a stream the limiter holds back was opened")
			return nil, nil
		})
		var we *WaitError
		if !errors.As(err, &we) || status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a wait of %v: %v, want a *WaitError", res.RetryAfter, err)
		}
	}
}

type sequence struct{ results []client.Result }

func (s *sequence) Allow(context.Context, string, client.Limit) (client.Result, error) {
	res := s.results[0]
	if len(s.results) > 1 {
		s.results = s.results[1:]
	}
	return res, nil
}

func TestNewClientRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		lim  Decider
		opts ClientOptions
		want string
	}{
		{"limit without limiter", nil, ClientOptions{Limit: bucket}, "Limiter"},
		{"bad limit", &constant{}, ClientOptions{Limit: client.TokenBucket{}}, "ClientOptions.Limit"},
		{"negative wait", nil, ClientOptions{MaxWait: -1}, "ClientOptions.MaxWait"},
		{"jitter", nil, ClientOptions{Jitter: 1.5}, "ClientOptions.Jitter"},
	} {
		c, err := NewClient(tt.lim, tt.opts)
		var ce *ConfigError
		if c != nil || !errors.As(err, &ce) || ce.Field != tt.want {
			t.Errorf("%s: %v, %v; want a *ConfigError of %s", tt.name, c, err, tt.want)
		}
	}
}

// A method declared idempotent in its proto is retried without being marked; one that is not
// declared so, or unknown, is not.
func TestDeclaredIdempotent(t *testing.T) {
	level := func(l descriptorpb.MethodOptions_IdempotencyLevel) *descriptorpb.MethodOptions {
		return &descriptorpb.MethodOptions{IdempotencyLevel: l.Enum()}
	}
	str := func(s string) *string { return &s }
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:        str("grpclimit_test/idem.proto"),
		Package:     str("grpclimit.test"),
		Syntax:      str("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: str("M")}},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: str("S"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: str("Read"), InputType: str(".grpclimit.test.M"), OutputType: str(".grpclimit.test.M"), Options: level(descriptorpb.MethodOptions_NO_SIDE_EFFECTS)},
			{Name: str("Put"), InputType: str(".grpclimit.test.M"), OutputType: str(".grpclimit.test.M"), Options: level(descriptorpb.MethodOptions_IDEMPOTENT)},
			{Name: str("Post"), InputType: str(".grpclimit.test.M"), OutputType: str(".grpclimit.test.M")},
		}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]bool{
		"/grpclimit.test.S/Read": true, "/grpclimit.test.S/Put": true, "/grpclimit.test.S/Post": false,
		"/grpclimit.test.S/None": false, "/no.Such/M": false, "garbage": false,
	} {
		if got := DeclaredIdempotent(method); got != want {
			t.Errorf("DeclaredIdempotent(%q) = %v, want %v", method, got, want)
		}
	}
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	c, _ := NewClient(nil, ClientOptions{Now: clock.Now, Sleep: clock.Sleep, Rand: func() float64 { return 0 }})
	calls := 0
	if err := c.unary(context.Background(), "/grpclimit.test.S/Read", nil, nil, nil, invoker(1, time.Second, &calls)); err != nil || calls != 2 {
		t.Errorf("a method declared NO_SIDE_EFFECTS: %v after %d calls, want retried", err, calls)
	}
	calls = 0
	if err := c.unary(context.Background(), "/grpclimit.test.S/Post", nil, nil, nil, invoker(1, time.Second, &calls)); err == nil || calls != 1 {
		t.Errorf("a method not declared idempotent: %v after %d calls, want not retried", err, calls)
	}
}
