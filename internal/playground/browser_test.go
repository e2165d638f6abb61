package playground_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/playground"
)

// browser starts headless Chromium ($RLFN_CHROMIUM, else chromium or google-chrome on the
// PATH) with the flags a container running as root needs, and returns a tab's context. Without
// a browser the test skips, or fails when CI=true, as a test does without its server.
func browser(t *testing.T, width, height int) context.Context {
	t.Helper()
	path := os.Getenv("RLFN_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		noBrowser(t, errors.New("no chromium on the PATH"))
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.Flag("headless", "new"),
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(width, height),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(ctx)
	t.Cleanup(cancelTab)
	// The first action starts the browser: a browser that cannot start is unavailable, not a
	// failure of the page.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		noBrowser(t, fmt.Errorf("%s: %w", path, err))
	}
	return ctx
}

// noBrowser ends a test that has no browser: it skips, or fails when CI is set true, so that a
// CI run can never pass by silently skipping.
func noBrowser(t *testing.T, err error) {
	t.Helper()
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("browser: %v (CI=true: failing instead of skipping)", err)
	}
	t.Skipf("browser: %v (skipping: install Debian's chromium, make deps does, or set RLFN_CHROMIUM; with CI=true this fails)", err)
}

// waitText waits until the element with id reads want.
func waitText(id, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		js := fmt.Sprintf(`(document.getElementById(%q) || {}).textContent === %q`, id, want)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
			got, _ := chromedp.Run(context.WithoutCancel(ctx), chromedp.Evaluate[string](
				fmt.Sprintf(`String((document.getElementById(%q) || {}).textContent)`, id)))
			return fmt.Errorf("#%s reads %q, want %q: %w", id, got, want, err)
		}
		return nil
	})
}

// TestBrowser drives the page in headless Chromium against a real Valkey: the token bucket card
// with capacity 5 admits 5 of a burst of 10 and denies 5, admits again after Reset, and is
// used from the keyboard; then every card decides, and the page is photographed (the
// README's docs/playground.png). The screenshot is written to the test's artifact directory
// (go test -artifacts keeps it) and to $RLFN_PLAYGROUND_SCREENSHOT when set.
func TestBrowser(t *testing.T) {
	e := served(t, true)
	ctx := browser(t, 1400, 1000)

	err := chromedp.Do(ctx,
		chromedp.Navigate(e.page),
		chromedp.WaitVisible(chromedp.ID("token_bucket-capacity")),
		waitText("status", "Connected to "+e.url+": library ratelimit "+workingVersion+" is loaded."),
		chromedp.SetValue(chromedp.ID("token_bucket-capacity"), "5"),
		chromedp.SetValue(chromedp.ID("token_bucket-burst-n"), "10"),
		chromedp.Click(chromedp.ID("token_bucket-burst")),
		waitText("token_bucket-denied", "5"),
		waitText("token_bucket-admitted", "5"),
		waitText("token_bucket-remaining", "0"),

		chromedp.Click(chromedp.ID("token_bucket-reset")),
		waitText("token_bucket-admitted", "0"),
		waitText("token_bucket-denied", "0"),
		chromedp.Click(chromedp.ID("token_bucket-send")),
		waitText("token_bucket-admitted", "1"),
		waitText("token_bucket-remaining", "4"),

		// The keyboard: Enter on a focused button presses it.
		chromedp.Focus(chromedp.ID("token_bucket-send")),
		chromedp.KeyEvent("\r"),
		waitText("token_bucket-admitted", "2"),
		// Enter in the burst size bursts (3 admitted of the 3 or more tokens left), where it
		// used to submit the form: one Send.
		chromedp.SetValue(chromedp.ID("token_bucket-burst-n"), "3"),
		chromedp.Focus(chromedp.ID("token_bucket-burst-n")),
		chromedp.KeyEvent("\r"),
		waitText("token_bucket-admitted", "5"),
		chromedp.SetValue(chromedp.ID("token_bucket-burst-n"), "10"),
	)
	if err != nil {
		t.Fatal(err)
	}

	// The forms' bounds are the ones the server sent with the cards (the client's, as the
	// library's): a sliding log's limit stops at 100000, and the page says so without a call.
	bounds, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`['fixed_window-limit', 'sliding_log-limit', 'token_bucket-periodMs']
		.map(id => document.getElementById(id).min + '..' + document.getElementById(id).max)`))
	if want := []string{"1..999999999999999", "1..100000", "1..100000000000"}; err != nil || !slices.Equal(bounds, want) {
		t.Errorf("the forms' bounds are %q (%v), want %q", bounds, err, want)
	}
	err = chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("sliding_log-limit"), "100001"),
		chromedp.Click(chromedp.ID("sliding_log-send")),
		waitText("sliding_log-error", "Limit must be a whole number from 1 to 100000."),
		chromedp.SetValue(chromedp.ID("sliding_log-limit"), "5"),
	)
	if err != nil {
		t.Fatal(err)
	}

	// Every card decides: the boundary scenario (run by the server, at most one 5s window
	// away) on the windows while the buckets take a burst each.
	err = chromedp.Do(ctx,
		chromedp.Click(chromedp.ID("boundary")),
		// While the scenario runs its cards are its own: a Send says so and sends nothing.
		chromedp.Click(chromedp.ID("fixed_window-send")),
		waitText("fixed_window-error", "The boundary scenario is running on this card: send when it ends."),
		chromedp.Click(chromedp.ID("token_bucket-reset")),
		waitText("token_bucket-admitted", "0"),
		chromedp.Click(chromedp.ID("token_bucket-burst")),
		chromedp.Click(chromedp.ID("leaky_police-burst")),
		chromedp.Click(chromedp.ID("leaky_shape-burst")),
		waitText("leaky_shape-shaped", "4"),
		waitText("leaky_police-denied", "5"),
		// The token bucket refills one token a second: a send each second is admitted.
		chromedp.Sleep(1100*time.Millisecond),
		chromedp.Click(chromedp.ID("token_bucket-send")),
		waitText("token_bucket-admitted", "6"),
		chromedp.Sleep(1100*time.Millisecond),
		chromedp.Click(chromedp.ID("token_bucket-send")),
		waitText("token_bucket-admitted", "7"),
	)
	if err != nil {
		t.Fatal(err)
	}
	status, err := chromedp.Run(ctx, chromedp.Poll[string](
		`(t => t.startsWith('Admitted around the edge') && t)(document.getElementById('boundary-status').textContent)`,
		chromedp.WithPollingTimeout(15*time.Second)))
	if err != nil {
		t.Fatalf("the boundary scenario did not end: %v", err)
	}
	t.Logf("boundary: %s", status)
	// Around the edge the fixed window admits twice its limit of 5; the sliding log, 5.
	for id, want := range map[string]string{"fixed_window": "10", "sliding_log": "5"} {
		if got := text(t, ctx, id+"-admitted"); got != want {
			t.Errorf("boundary scenario: %s admitted %s, want %s", id, got, want)
		}
	}
	if hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('fixed_window-error').hidden`)); err != nil || !hidden {
		t.Errorf("the fixed window card still shows %q after the scenario (%v)", text(t, ctx, "fixed_window-error"), err)
	}

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.ArtifactDir(), "playground.png")
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", out)
	if also := os.Getenv("RLFN_PLAYGROUND_SCREENSHOT"); also != "" {
		if err := os.WriteFile(also, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", also)
	}

	// A narrow window (a phone) gets one column and no sideways scrolling.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(360, 800), chromedp.Sleep(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`))
	if err != nil || overflow {
		t.Errorf("at 360px wide the page scrolls sideways (%v)", err)
	}

	// A card keeps at most 2000 marks however many decisions arrive within the timeline's
	// span; its counts still sum them all.
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`(() => {
		const c = cards.get('sliding_log'), at = serverNow(), before = c.counts.admitted;
		addDecisions(c, Array.from({length: 5000}, () =>
			({at, allowed: true, limit: 5, remaining: 1, retryAfterMs: 0, resetAfterMs: 0, delayMs: 0})));
		return [c.decisions.length, c.counts.admitted - before];
	})()`))
	if err != nil || len(kept) != 2 || kept[0] != 2000 || kept[1] != 5000 {
		t.Errorf("5000 decisions at once: the card keeps %v marks and counts (want 2000, 5000), %v", kept, err)
	}
}

// text reads the text of the element with id.
func text(t *testing.T, ctx context.Context, id string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`String((document.getElementById(%q) || {}).textContent)`, id)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBrowserAbsentLibrary: on a server without the library the page says so and shows the
// deploy command for its URL.
func TestBrowserAbsentLibrary(t *testing.T) {
	e := served(t, false)
	ctx := browser(t, 1000, 800)
	err := chromedp.Do(ctx,
		chromedp.Navigate(e.page),
		chromedp.WaitVisible(chromedp.ID("absent")),
		waitText("deploy-command", "rlfn --url '"+e.url+"' deploy"),
		waitText("status", "Connected to "+e.url+", but the library is missing."),
	)
	if err != nil {
		t.Fatal(err)
	}
	if why := text(t, ctx, "absent-why"); !strings.Contains(why, "has no ratelimit library") {
		t.Errorf("the banner says %q", why)
	}
}

// TestBrowserServerStops: when the server stops answering, a card's failed request says so and
// the status line above follows (it said "loaded" until the page was reloaded); when the
// server answers again, the status line says so by itself.
func TestBrowserServerStops(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	load(t, vk)
	srv := httptest.NewServer(newServer(t, vk, playground.Options{Deadline: 300 * time.Millisecond}))
	t.Cleanup(srv.Close)
	ctx := browser(t, 1000, 800)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(srv.URL),
		chromedp.WaitVisible(chromedp.ID("token_bucket-send")),
		waitText("status", "Connected: library ratelimit "+workingVersion+" is loaded."),
	); err != nil {
		t.Fatal(err)
	}
	// CLIENT PAUSE holds every client's commands for 3s: a server that does not answer.
	if err := vk.Do(context.Background(), vk.B().Arbitrary("CLIENT", "PAUSE", "3000", "ALL").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	const gone = "The server cannot be reached: the server did not answer within 300ms (reading the server's clock (TIME): context deadline exceeded). Retrying…"
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.ID("token_bucket-send")),
		waitText("token_bucket-error", "the server did not answer within 300ms (reading the server's clock (TIME): context deadline exceeded)"),
		waitText("status", gone),
		// The pause ends within 3s; the status is read again every 3s.
		waitText("status", "Connected: library ratelimit "+workingVersion+" is loaded."),
		chromedp.Click(chromedp.ID("token_bucket-send")),
		waitText("token_bucket-admitted", "1"),
	); err != nil {
		t.Fatal(err)
	}
}

// waitTrue waits until js is true in the page, for up to d.
func waitTrue(js string, d time.Duration) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
			return fmt.Errorf("waiting for %s: %w", js, err)
		}
		return nil
	})
}

// startsWith is the JS that the text of the element with id starts with prefix.
func startsWith(id, prefix string) string {
	return fmt.Sprintf(`String((document.getElementById(%q) || {}).textContent).startsWith(%q)`, id, prefix)
}

// TestBrowserCalendarAndPenalty: the calendar card shows its window's end counting down, its
// burst denies past the limit, and once the window ends (a few seconds after loading here,
// Options.CalendarLead) a send is admitted in a new window; the fixed window card's penalty
// switch makes a denial block the card, the page counting the block down until it ends.
func TestBrowserCalendarAndPenalty(t *testing.T) {
	s := harness.StartValkey(t)
	vk := s.Client(t)
	load(t, vk)
	url := "redis://" + s.Addr
	srv := httptest.NewServer(newServer(t, vk, playground.Options{Server: url, CalendarLead: 6 * time.Second}))
	t.Cleanup(srv.Close)
	ctx := browser(t, 1400, 1000)

	err := chromedp.Do(ctx,
		chromedp.Navigate(srv.URL),
		chromedp.WaitVisible(chromedp.ID("calendar-limit")),
		waitText("status", "Connected to "+url+": library ratelimit "+workingVersion+" is loaded."),
		waitTrue(startsWith("calendar-window", "This window ends at "), 5*time.Second),
		chromedp.SetValue(chromedp.ID("calendar-limit"), "3"),
		chromedp.SetValue(chromedp.ID("calendar-burst-n"), "5"),
		chromedp.Click(chromedp.ID("calendar-burst")),
		waitText("calendar-admitted", "3"),
		waitText("calendar-denied", "2"),
		waitTrue(startsWith("calendar-window", "The window ended at "), 10*time.Second),
		chromedp.Click(chromedp.ID("calendar-send")),
		waitText("calendar-admitted", "4"),
		waitText("calendar-remaining", "2"),
		waitTrue(startsWith("calendar-window", "This window ends at "), 5*time.Second),
	)
	if err != nil {
		t.Fatal(err)
	}
	// The card has no switch; the fixed window's starts off, its number disabled until on.
	state, err := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`[!!document.getElementById('calendar-penalty'),
		document.getElementById('fixed_window-penalty').checked, document.getElementById('fixed_window-penaltyMs').disabled]`))
	if err != nil || !slices.Equal(state, []bool{false, false, true}) {
		t.Errorf("the switches: %v (%v); want none on the calendar, the fixed window's off and its number disabled", state, err)
	}

	err = chromedp.Do(ctx,
		chromedp.Click(chromedp.ID("fixed_window-penalty")),
		chromedp.SetValue(chromedp.ID("fixed_window-penaltyMs"), "2500"),
		chromedp.SetValue(chromedp.ID("fixed_window-limit"), "2"),
		chromedp.SetValue(chromedp.ID("fixed_window-burst-n"), "4"),
		chromedp.Click(chromedp.ID("fixed_window-burst")),
		waitText("fixed_window-admitted", "2"),
		waitText("fixed_window-denied", "2"),
		waitText("fixed_window-blocked", "2"),
		waitTrue(`!document.getElementById('fixed_window-block').hidden`, 2*time.Second),
		waitTrue(startsWith("fixed_window-block", "Blocked by the penalty: "), 2*time.Second),
		// it counts down, and goes when the block ends
		waitTrue(`document.getElementById('fixed_window-block').hidden`, 5*time.Second),
		chromedp.Click(chromedp.ID("fixed_window-send")),
		waitText("fixed_window-admitted", "3"),
	)
	if err != nil {
		t.Fatal(err)
	}
	// A bad penalty is the page's error, before any call.
	err = chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("fixed_window-penaltyMs"), "0"),
		chromedp.Click(chromedp.ID("fixed_window-send")),
		waitText("fixed_window-error", "Penalty (ms) must be a whole number from 1 to 100000000000."),
		waitText("fixed_window-admitted", "3"),
		// Reset deletes the limiter's key and the block's
		chromedp.Click(chromedp.ID("fixed_window-reset")),
		waitTrue(startsWith("fixed_window-last", "Reset: the keys"), 5*time.Second),
	)
	if err != nil {
		t.Fatal(err)
	}
	if n := dbsize(t, vk); n != 1 {
		t.Errorf("%d keys after the fixed window's reset, want the calendar's alone", n)
	}
}
