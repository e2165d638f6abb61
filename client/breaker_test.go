package client

import (
	"testing"
	"time"
)

// event is one thing that happens to a breaker.
type event uint8

const (
	acquire  event = iota // a call asks to go to the server
	ok                    // a call (not the probe) was answered
	fail                  // a call (not the probe) failed
	probeOK               // the probe was answered
	probeErr              // the probe failed
	cancel                // the probe's caller gave up
)

type bstep struct {
	at        time.Duration // on the fake clock
	ev        event
	wantPass  bool // acquire only
	wantProbe bool // acquire only
	want      breakerState
}

// The breaker's state machine, with 3 failures to open and a cooldown of 1s.
func TestBreaker(t *testing.T) {
	opened := []bstep{{0, fail, false, false, closed}, {0, fail, false, false, closed}, {0, fail, false, false, open}}
	tests := []struct {
		name  string
		steps []bstep
	}{
		{name: "closed passes calls", steps: []bstep{
			{0, acquire, true, false, closed},
			{0, ok, false, false, closed},
		}},
		{name: "opens after 3 consecutive failures", steps: opened},
		{name: "a success resets the count", steps: []bstep{
			{0, fail, false, false, closed},
			{0, fail, false, false, closed},
			{0, ok, false, false, closed},
			{0, fail, false, false, closed},
			{0, fail, false, false, closed},
			{0, fail, false, false, open},
		}},
		{name: "open sends nothing before the cooldown", steps: append(opened[:3:3],
			bstep{0, acquire, false, false, open},
			bstep{999 * time.Millisecond, acquire, false, false, open},
		)},
		{name: "one probe after the cooldown", steps: append(opened[:3:3],
			bstep{time.Second, acquire, true, true, halfOpen},
			bstep{time.Second, acquire, false, false, halfOpen},
			bstep{5 * time.Second, acquire, false, false, halfOpen},
		)},
		{name: "the probe answered closes it", steps: append(opened[:3:3],
			bstep{time.Second, acquire, true, true, halfOpen},
			bstep{time.Second, probeOK, false, false, closed},
			bstep{time.Second, acquire, true, false, closed},
			// the count starts over
			bstep{time.Second, fail, false, false, closed},
			bstep{time.Second, fail, false, false, closed},
			bstep{time.Second, fail, false, false, open},
		)},
		{name: "the probe failed opens it for a whole cooldown", steps: append(opened[:3:3],
			bstep{1500 * time.Millisecond, acquire, true, true, halfOpen},
			bstep{1600 * time.Millisecond, probeErr, false, false, open},
			bstep{2599 * time.Millisecond, acquire, false, false, open},
			bstep{2600 * time.Millisecond, acquire, true, true, halfOpen},
		)},
		{name: "a canceled probe lets the next call probe at once", steps: append(opened[:3:3],
			bstep{time.Second, acquire, true, true, halfOpen},
			bstep{time.Second, cancel, false, false, open},
			bstep{time.Second, acquire, true, true, halfOpen},
		)},
		{name: "late failures do not extend the cooldown", steps: append(opened[:3:3],
			bstep{500 * time.Millisecond, fail, false, false, open},
			bstep{500 * time.Millisecond, fail, false, false, open},
			bstep{500 * time.Millisecond, fail, false, false, open},
			bstep{time.Second, acquire, true, true, halfOpen},
		)},
		{name: "a late success does not close it", steps: append(opened[:3:3],
			bstep{100 * time.Millisecond, ok, false, false, open},
			bstep{100 * time.Millisecond, acquire, false, false, open},
		)},
		{name: "a late failure while half-open leaves the probe alone", steps: append(opened[:3:3],
			bstep{time.Second, acquire, true, true, halfOpen},
			bstep{time.Second, fail, false, false, halfOpen},
			bstep{time.Second, probeOK, false, false, closed},
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBreaker(3, time.Second)
			for i, s := range tt.steps {
				now := int64(s.at)
				clock := func() int64 { return now }
				switch s.ev {
				case acquire:
					pass, probe := b.acquire(clock)
					if pass != s.wantPass || probe != s.wantProbe {
						t.Fatalf("step %d at %s: acquire = %v, %v; want %v, %v", i, s.at, pass, probe, s.wantPass, s.wantProbe)
					}
				case ok:
					b.success(false)
				case fail:
					b.failure(false, now)
				case probeOK:
					b.success(true)
				case probeErr:
					b.failure(true, now)
				case cancel:
					b.release(true)
				}
				if got := b.current(); got != s.want {
					t.Fatalf("step %d at %s: state %s, want %s", i, s.at, got, s.want)
				}
			}
		})
	}
}

// Transitions are reported once each, for the metric.
func TestBreakerReportsTransitions(t *testing.T) {
	b := newBreaker(2, time.Second)
	if s := b.failure(false, 0); s != -1 {
		t.Errorf("first failure: %s", s)
	}
	if s := b.failure(false, 0); s != open {
		t.Errorf("second failure: %s, want open", s)
	}
	if s := b.failure(false, 0); s != -1 {
		t.Errorf("failure while open: %s", s)
	}
	if s := b.success(false); s != -1 {
		t.Errorf("success while open: %s", s)
	}
	if s := b.success(true); s != closed {
		t.Errorf("probe success: %s, want closed", s)
	}
}

func TestBreakerRetryAfter(t *testing.T) {
	b := newBreaker(1, time.Second)
	tests := []struct {
		name string
		give func()
		at   time.Duration
		want time.Duration
	}{
		{name: "closed: the cooldown", give: func() {}, at: 0, want: time.Second},
		{name: "open: until the probe", give: func() { b.failure(false, int64(100*time.Millisecond)) }, at: 400 * time.Millisecond, want: 700 * time.Millisecond},
		{name: "open, probe due: a millisecond", give: func() {}, at: 2 * time.Second, want: time.Millisecond},
		{name: "half-open: a millisecond", give: func() { b.acquire(func() int64 { return int64(2 * time.Second) }) }, at: 2 * time.Second, want: time.Millisecond},
	}
	for _, tt := range tests {
		tt.give()
		if got := b.retryAfter(int64(tt.at)); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, got, tt.want)
		}
	}
}

// A call that read the opening time before another call's probe failed and opened the breaker
// again must not become a second probe at once: the new cooldown runs from the reopening.
func TestBreakerProbeRacesReopening(t *testing.T) {
	b := newBreaker(1, 10)
	b.failure(false, 0) // open at 0
	raced := false
	pass, probe := b.acquire(func() int64 {
		if !raced {
			raced = true
			// between this call's reading of openedAt and its swap: another call probes at 20,
			// fails, and opens the breaker again at 20
			if p, pr := b.acquire(func() int64 { return 20 }); !p || !pr {
				t.Fatalf("the other call: pass %v probe %v, want the probe", p, pr)
			}
			b.failure(true, 20)
		}
		return 20
	})
	if pass || probe {
		t.Fatalf("acquire after a reopening: pass %v probe %v, want neither until 30", pass, probe)
	}
	if got := b.current(); got != open {
		t.Fatalf("state %v, want open", got)
	}
	if p, pr := b.acquire(func() int64 { return 29 }); p || pr {
		t.Fatalf("at 29: pass %v probe %v, want the cooldown from 20", p, pr)
	}
	if p, pr := b.acquire(func() int64 { return 30 }); !p || !pr {
		t.Fatalf("at 30: pass %v probe %v, want the probe", p, pr)
	}
}

// The memory of an old node learns from the calls it serves: a node that refused a 1.2 call
// while on 1.0.0, then upgraded to 1.1.0, serves 1.1 calls as soon as one of them succeeds,
// and is forgotten once a 1.2 call succeeds.
func TestOldLibraryLearns(t *testing.T) {
	b := newBreaker(5, time.Second)
	b.old.Store(&oldLibrary{err: &VersionError{Node: "n", Version: "1.0.0", Want: "1.2.0", Function: "rl_calendar"}, until: int64(time.Hour)})
	if b.tooOld(0, "1.1.0") == nil {
		t.Fatal("a 1.1 call let through a node known to run 1.0.0")
	}
	b.forgetOld("1.1.0") // the probe of the cooldown: a 1.1 call the node served
	if err := b.tooOld(0, "1.1.0"); err != nil {
		t.Fatalf("a 1.1 call after the node served one: %v", err)
	}
	if b.tooOld(0, "1.2.0") == nil {
		t.Fatal("the node's refusal of 1.2 calls was forgotten by a 1.1 call")
	}
	b.forgetOld("1.2.0")
	if b.old.Load() != nil {
		t.Fatal("a 1.2 call the node served did not clear the memory")
	}
}
