package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/rlfn/rlfn/client"
)

// bigRules are n rules of one limit over n keys of their own, under prefix.
func bigRules(prefix string, n int, limit client.Limit) []client.Rule {
	rules := make([]client.Rule, n)
	for i := range rules {
		rules[i] = client.Rule{Key: fmt.Sprintf("%s:%d", prefix, i), Limit: limit}
	}
	return rules
}

// counters reads the client's counters from reader: name{attr=value} -> sum.
func counters(t testing.TB, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					name := m.Name
					for _, a := range p.Attributes.ToSlice() {
						name += fmt.Sprintf("{%s=%s}", a.Key, a.Value.Emit())
					}
					out[name] += p.Value
				}
			}
		}
	}
	return out
}

// One AllowAll of 100,000 rules, beside callers under steady load: refused at once, before
// anything is sent, with a short *LimitError; one of 1,000 (the default bound) decided. The
// other callers' decisions are all the server's (ReturnError: any failure is an error), and
// no breaker moves.
func TestAllowAllOversized(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		reader := sdkmetric.NewManualReader()
		// A deadline of a second: the machines that run the tests are shared, and a call of
		// the load that misses 100ms there says nothing about the big decision.
		lim, err := client.New(tg.c, client.Options{Fallback: client.ReturnError, Deadline: time.Second,
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
		if err != nil {
			t.Fatal(err)
		}
		prefix := keyFor(t)
		limit := client.FixedWindow{Limit: 1_000_000, Window: time.Hour}
		ctx := context.Background()
		// the connections to every node, before the load
		for i := 0; ; i++ {
			if _, err := lim.AllowAll(ctx, bigRules(prefix+":warm", 100, limit)); err == nil {
				break
			} else if i == 100 {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // a breaker the first calls opened probes again
		}
		before := counters(t, reader)
		stop := make(chan struct{})
		var mu sync.Mutex
		var sent int
		var failed []string
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					res, err := lim.AllowAll(ctx, bigRules(fmt.Sprintf("%s:load%d:%d", prefix, c, i%100), 2, limit))
					mu.Lock()
					sent++
					if err != nil || !res.Allowed || res.Source != client.FromServer {
						failed = append(failed, fmt.Sprintf("%+v %v", res, err))
					}
					mu.Unlock()
				}
			})
		}
		huge := bigRules(prefix+":huge", 100_000, limit)
		for range 3 {
			_, err := lim.AllowAll(ctx, huge)
			var le *client.LimitError
			if !errors.As(err, &le) || le.Field != "rules" || len(err.Error()) > 100 || !strings.Contains(err.Error(), "MaxRules") {
				t.Fatalf("100,000 rules: %v", err)
			}
		}
		res, err := lim.AllowAll(ctx, bigRules(prefix+":under", 1000, limit))
		if err != nil || !res.Allowed || res.Remaining != 999_999 {
			t.Fatalf("1,000 rules: %+v %v", res, err)
		}
		close(stop)
		wg.Wait()
		if len(failed) > 0 || sent == 0 {
			t.Errorf("%d of %d decisions of the load failed: %v", len(failed), sent, failed[:min(3, len(failed))])
		}
		for name, n := range counters(t, reader) {
			if (strings.HasPrefix(name, "rlfn.client.breaker") || strings.HasPrefix(name, "rlfn.client.errors")) && n != before[name] {
				t.Errorf("%s: %d since the load started", name, n-before[name])
			}
		}
		t.Logf("%d decisions of the load beside the big ones", sent)
	})
}

// pauseAtRefund is a valkey.Client that pauses the server (pause) when the first refund is
// sent: a node that stops answering in the middle of a decision's refunds.
type pauseAtRefund struct {
	valkey.Client
	once  sync.Once
	pause func()
}

func (p *pauseAtRefund) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	if args := cmd.Commands(); len(args) > 1 && strings.HasSuffix(args[1], "_refund") {
		p.once.Do(p.pause)
	}
	return p.Client.Do(ctx, cmd)
}

// A decision of 1,000 keys, the last denying, whose node stops answering (CLIENT PAUSE WRITE,
// 1.5s) when its 999 refunds start: the denial is returned at once with no error, the breaker
// opens on the refunds that time out, and those it kept from being sent are tried again until
// the node answers. Once it does, every unit is given back, or the metric counts the units that
// may not have been (refunds sent and not answered, never sent twice); the log says so in one
// short line.
func TestAllowAllRefundsWhilePaused(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg *target) {
		const n = 1000
		pause := 1500 * time.Millisecond
		vk := &pauseAtRefund{Client: tg.c, pause: func() {
			if err := do(t, tg.primary, tg.primary.B().ClientPause().Timeout(pause.Milliseconds()).Write().Build()).Error(); err != nil {
				t.Error(err)
			}
		}}
		reader := sdkmetric.NewManualReader()
		var logs syncLines
		lim, err := client.New(vk, client.Options{Fallback: client.ReturnError, Logger: logs.logger(),
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
		if err != nil {
			t.Fatal(err)
		}
		other, err := client.New(tg.c, client.Options{Fallback: client.ReturnError, Deadline: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		limit := client.FixedWindow{Limit: 10, Window: time.Hour}
		rules := bigRules(keyFor(t), n, limit)
		// the last key is full: it denies, after the others admitted
		if res, err := other.AllowN(ctx, rules[n-1].Key, limit, 10); err != nil || !res.Allowed {
			t.Fatalf("%+v %v", res, err)
		}
		res, err := lim.AllowAll(ctx, rules)
		if err != nil || res.Allowed || res.Rule != n-1 {
			t.Fatalf("got %+v, %v: want the last rule's denial, no error", res, err)
		}
		owedAtFirst := lim.OwedRefunds()
		for deadline := time.Now().Add(time.Minute); lim.OwedRefunds() > 0; {
			if time.Now().After(deadline) {
				t.Fatalf("%d refunds still owed after a minute", lim.OwedRefunds())
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(pause) // the refunds the paused server held have run
		taken := int64(0)
		for _, r := range rules[:n-1] {
			p, err := other.Peek(ctx, r.Key, limit)
			if err != nil {
				t.Fatal(err)
			}
			taken += 10 - p.Remaining
		}
		c := counters(t, reader)
		lost := int64(0)
		for name, v := range c {
			if strings.HasPrefix(name, "rlfn.client.refunds.lost") {
				lost += v
			}
		}
		t.Logf("%d refunds owed after the decision, %d units lost by the metric, %d still taken; metrics %v", owedAtFirst, lost, taken, c)
		if owedAtFirst == 0 {
			t.Error("no refund was owed: the node was not paused during the refunds")
		}
		if taken > lost {
			t.Errorf("%d units still taken, the metric says %d may not have been given back", taken, lost)
		}
		said := logs.with("event=refund_lost")
		if lost > 0 && len(said) == 0 {
			t.Error("units lost, not logged")
		}
		for _, line := range said {
			if len(line) > 500 {
				t.Errorf("a long line: %s", line)
			}
		}
	})
}

// syncLines collects a Limiter's log lines (slog's text format).
type syncLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (s *syncLines) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncLines) logger() *slog.Logger { return slog.New(slog.NewTextHandler(s, nil)) }

// with returns the lines that hold sub.
func (s *syncLines) with(sub string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for line := range strings.Lines(s.buf.String()) {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return out
}
