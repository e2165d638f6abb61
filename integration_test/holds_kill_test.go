package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/valkey-io/valkey-go"
)

// The holder process of TestHoldsOfAKilledProcess: the test binary run again with
// killedHolderEnv set to the servers' addresses, and the key prefix in killedPrefixEnv.
const (
	killedHolderEnv = "RLFN_KILLED_HOLDER"
	killedPrefixEnv = "RLFN_KILLED_PREFIX"
	killedHolds     = 50
	killedCost      = 40
	killedTTL       = time.Second
)

// killedLimit is the limit every hold of the killed process is on: one key each, so that each
// hold's units are read on their own.
var killedLimit = client.FixedWindow{Limit: 100, Window: time.Hour, Name: "killed"}

// A process SIGKILLed with 50 open holds never settles them: the server gives the units of
// those made without Keep back at their expiry (swept by the next call that names the hold
// key), and leaves those made with Keep charged. Checked 100 ms after the latest expiry the
// holder reported, on every target.
func TestHoldsOfAKilledProcess(t *testing.T) {
	if addrs := os.Getenv(killedHolderEnv); addrs != "" {
		holdThenWait(t, addrs, os.Getenv(killedPrefixEnv))
		return
	}
	forEachTarget(t, func(t *testing.T, tg *target) {
		prefix := keyFor(t)
		addrs := strings.Join(slices.Sorted(maps.Keys(tg.c.Nodes())), ",")
		cmd := exec.Command(os.Args[0], "-test.run=^TestHoldsOfAKilledProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), killedHolderEnv+"="+addrs, killedPrefixEnv+"="+prefix)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

		// The holder prints "held <latest expiry, unix ms>" once its 50 holds are taken.
		lines := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if l := sc.Text(); strings.HasPrefix(l, "held ") {
					lines <- l
					return
				}
			}
			close(lines)
		}()
		var latest time.Time
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the holder ended without holding")
			}
			ms, err := strconv.ParseInt(strings.TrimPrefix(l, "held "), 10, 64)
			if err != nil {
				t.Fatalf("holder said %q", l)
			}
			latest = time.UnixMilli(ms)
		case <-time.After(30 * time.Second):
			t.Fatal("the holder took no holds in 30 s")
		}
		if err := cmd.Process.Kill(); err != nil { // SIGKILL: nothing of the process runs after it
			t.Fatal(err)
		}
		_ = cmd.Wait()

		lim := newLimiterFor(t, tg)
		ctx := ctx5s(t)
		for i := range killedHolds {
			key, _ := killedKey(prefix, i)
			if got := heldLeft(t, lim, key, killedLimit); got != killedLimit.Limit-killedCost {
				t.Fatalf("hold %d: %d left while the dead process's hold lives, want %d", i, got, killedLimit.Limit-killedCost)
			}
		}
		time.Sleep(time.Until(latest) + 100*time.Millisecond)
		for i := range killedHolds {
			key, keep := killedKey(prefix, i)
			// a call that names the hold key sweeps the expired hold
			h, _, err := lim.Hold(ctx, []client.Rule{{Key: key, Limit: killedLimit, Cost: 1}}, client.HoldOptions{TTL: time.Minute})
			if err != nil || h == nil {
				t.Fatalf("hold %d: sweeping call: %v", i, err)
			}
			want := killedLimit.Limit - 1
			if keep {
				want -= killedCost
			}
			if got := heldLeft(t, lim, key, killedLimit); got != want {
				t.Errorf("hold %d (keep %t): %d left 100 ms after the expiry, want %d", i, keep, got, want)
			}
			if _, err := h.Settle(ctx, []int64{0}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// killedKey is the key of the killed process's i-th hold, and whether it was made with Keep.
func killedKey(prefix string, i int) (string, bool) {
	return fmt.Sprintf("%s:%d", prefix, i), i%2 == 1
}

func newLimiterFor(t *testing.T, tg *target) *client.Limiter {
	t.Helper()
	lim, err := client.New(tg.c, slowMachine)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// holdThenWait is the holder process: it takes the 50 holds, says so, and waits to be killed.
func holdThenWait(t *testing.T, addrs, prefix string) {
	vc, err := valkey.NewClient(valkey.ClientOption{InitAddress: strings.Split(addrs, ","), DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := client.New(vc, slowMachine)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var latest time.Time
	for i := range killedHolds {
		key, keep := killedKey(prefix, i)
		h, res, err := lim.Hold(ctx, []client.Rule{{Key: key, Limit: killedLimit, Cost: killedCost}}, client.HoldOptions{TTL: killedTTL, Keep: keep})
		if err != nil || h == nil {
			t.Fatalf("hold %d: %+v, %v", i, res, err)
		}
		if e := h.Expires(); e.After(latest) {
			latest = e
		}
	}
	fmt.Printf("held %d\n", latest.UnixMilli())
	time.Sleep(time.Minute)
}
