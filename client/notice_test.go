package client_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
)

// lines is a slog handler's output, safe for the Limiter's goroutines.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// An outage is said once when it starts and once when it ends, per node, however many calls
// fall back meanwhile; a node without the library is said with what to run.
func TestNoticesSayAnOutageOnce(t *testing.T) {
	var out lines
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	clock := newFakeClock()
	vk := mock.NewClient(gomock.NewController(t))
	vk.EXPECT().Nodes().Return(map[string]valkey.Client{"127.0.0.1:6379": vk}).AnyTimes()
	lim := newLimiter(t, vk, client.WithClock(client.Options{
		Logger:          log,
		BreakerFailures: 2,
		BreakerCooldown: time.Second,
	}, clock.now))
	ctx := context.Background()
	bucket := client.TokenBucket{Capacity: 100, Rate: 1, Period: time.Hour, Name: "api"}

	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 100, 99, 0, 1000, 0))),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused),
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(refused), // opens the breaker
	)
	for range 50 {
		if _, err := lim.Allow(ctx, "k", bucket); err != nil {
			t.Fatal(err)
		}
	}
	clock.advance(time.Second)
	gomock.InOrder(
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 100, 98, 0, 2000, 0))), // the probe
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(mock.Result(ints(1, 100, 97, 0, 3000, 0))).Times(9),
	)
	for range 10 {
		lim.Allow(ctx, "k", bucket)
	}
	want := `level=WARN msg="rlfn: the server cannot decide: limits go to the fallback" event=fallback node=127.0.0.1:6379 limit=token_bucket:api cause=unreachable fallback=local_fallback
level=WARN msg="rlfn: circuit breaker open: no call goes to the node until its cooldown ends" event=breaker_open node=127.0.0.1:6379 cause=unreachable cooldown=1s
level=INFO msg="rlfn: circuit breaker closed: the node answers" event=breaker_closed node=127.0.0.1:6379
level=INFO msg="rlfn: the server decides again" event=recovered node=127.0.0.1:6379 fallback_decisions=49
`
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	// A node without the library is said at once, with what to run; then, like every
	// notice, at most once in 10 seconds, with the lines not said counted in the next.
	out.buf.Reset()
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(missing).Times(3)
	for range 3 {
		lim.Allow(ctx, "k", bucket)
	}
	got := out.String()
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "event=library_missing") || !strings.Contains(got, "`rlfn deploy`") {
		t.Errorf("a node without the library, 3 calls within 10s:\n%s", got)
	}
	out.buf.Reset()
	clock.advance(10 * time.Second)
	vk.EXPECT().Do(gomock.Any(), gomock.Any()).Return(missing)
	lim.Allow(ctx, "k", bucket)
	if got := out.String(); !strings.Contains(got, "event=library_missing") || !strings.Contains(got, "suppressed=2") {
		t.Errorf("10s later:\n%s", got)
	}
}
