package playground

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
)

// loaded starts a Valkey 8 of the test's own with the working copy of the library, and the
// playground's handler for it.
func loaded(t *testing.T) *Server {
	t.Helper()
	vk := harness.StartValkey(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vk.Do(ctx, vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatalf("FUNCTION LOAD: %v", err)
	}
	s, err := New(vk, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBoundaryBusy: while a boundary scenario runs (its lock held), another one is refused with
// 409 and resets nothing; once it ends, the next one runs.
func TestBoundaryBusy(t *testing.T) {
	s := loaded(t)
	ctx := context.Background()
	if _, err := s.lim.Allow(ctx, string(FixedWindow), client.FixedWindow{Limit: 5, Window: time.Minute}); err != nil {
		t.Fatal(err)
	}
	run := func() *httptest.ResponseRecorder {
		p := `{"limit":5,"windowMs":1000}`
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/api/boundary",
			strings.NewReader(`{"fixed_window":`+p+`,"sliding_log":`+p+`,"sliding_window":`+p+`}`))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec
	}

	s.boundaryMu.Lock()
	rec := run()
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "already running") {
		t.Errorf("a second boundary scenario: %d %s; want 409, already running", rec.Code, rec.Body)
	}
	if n, err := s.vk.Do(ctx, s.vk.B().Exists().Key(FixedWindow.Key()).Build()).AsInt64(); err != nil || n != 1 {
		t.Errorf("the refused scenario reset the fixed window card (EXISTS %d, %v)", n, err)
	}
	s.boundaryMu.Unlock()

	if rec := run(); rec.Code != http.StatusOK {
		t.Errorf("the boundary scenario after the first ended: %d %s", rec.Code, rec.Body)
	}
}

// TestBurstStampsServerTime: a decision is stamped on the server's clock, not this process's:
// with a server an hour behind, so are the stamps. (The servers of the tests share this
// machine's clock, so only a clock given here can tell the two apart.)
func TestBurstStampsServerTime(t *testing.T) {
	s := loaded(t)
	const hourUs = int64(time.Hour / time.Microsecond)
	clk := serverClock{offsetUs: -hourUs}
	before := time.Now()
	ds, err := s.burst(context.Background(), clk, TokenBucket, client.TokenBucket{Capacity: 2, Rate: 1, Period: time.Minute}, 3, nil)
	after := time.Now()
	if err != nil || len(ds) != 3 {
		t.Fatalf("burst: %v, %d decisions", err, len(ds))
	}
	lo, hi := float64(before.UnixMicro()-hourUs)/1000, float64(after.UnixMicro()-hourUs)/1000
	for i, d := range ds {
		if d.At < lo || d.At > hi {
			t.Errorf("decision %d stamped %.3f, want the server's time, %.3f to %.3f", i, d.At, lo, hi)
		}
	}
}

// TestClockOf: the offset is the server's TIME minus the middle of the call that read it, so
// that a stamp taken at that middle reads the server's TIME.
func TestClockOf(t *testing.T) {
	start, end := time.UnixMicro(5_000_000), time.UnixMicro(5_002_000)
	clk := clockOf(1_700_000_000_000_000, start, end)
	if clk.offsetUs != 1_700_000_000_000_000-5_001_000 {
		t.Errorf("offset %d", clk.offsetUs)
	}
	if got := clk.at(start, end); got != 1_700_000_000_000 {
		t.Errorf("a stamp halfway through the TIME call reads %.3f, want the server's 1700000000000", got)
	}
	if got := clk.at(time.UnixMicro(6_000_000), time.UnixMicro(6_000_000)); got != 1_700_000_000_999 {
		t.Errorf("a stamp 999ms later reads %.3f", got)
	}
}
