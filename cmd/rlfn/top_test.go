package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/topkeys"
)

func TestMergeTop(t *testing.T) {
	a := []topkeys.Entry{
		{Algorithm: "token_bucket", Key: "x", Denials: 5, RetryAfterMs: 100, LastMs: 10},
		{Algorithm: "token_bucket", Key: "y", Denials: 3, RetryAfterMs: 50, LastMs: 10},
	}
	b := []topkeys.Entry{
		{Algorithm: "token_bucket", Key: "y", Denials: 4, RetryAfterMs: 70, LastMs: 20},
		{Algorithm: "token_bucket", Name: "n", Key: "x", Denials: 7, RetryAfterMs: -1, LastMs: 5},
	}
	got := mergeTop([][]topkeys.Entry{a, b})
	want := []topRow{ // most denied first, ties by key; the last denial's retry-after
		{Key: "x", Algorithm: "token_bucket", Name: "n", Denials: 7, RetryAfterMs: -1, LastMs: 5, Processes: 1},
		{Key: "y", Algorithm: "token_bucket", Denials: 7, RetryAfterMs: 70, LastMs: 20, Processes: 2},
		{Key: "x", Algorithm: "token_bucket", Denials: 5, RetryAfterMs: 100, LastMs: 10, Processes: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("mergeTop = %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestTop: two processes' Limiters publish the keys they deny; rlfn top merges them, with the
// override in force, on Valkey 8 (golden), Redis 7.0 and a cluster.
func TestTop(t *testing.T) {
	t.Run("valkey8", func(t *testing.T) {
		s := harness.StartValkey(t)
		loadCode(t, s, functions.Source)
		testTop(t, s.Addr, []string{s.Addr}, true)
	})
	t.Run("redis7.0", func(t *testing.T) {
		s := harness.StartRedis(t)
		loadCode(t, s, functions.Source)
		testTop(t, s.Addr, []string{s.Addr}, false)
	})
	t.Run("cluster", func(t *testing.T) {
		c := harness.StartCluster(t, 3, 0)
		for _, p := range c.Primaries {
			loadCode(t, p, functions.Source)
		}
		testTop(t, c.Primaries[0].Addr, c.Addrs(), false)
	})
}

// topCells is top's table as the golden file holds it: cells between " | ", the RETRY AFTER
// and LAST columns (which count) written as such (the JSON's are checked).
func topCells(out string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		cs := regexp.MustCompile(`\s{2,}`).Split(line, -1)
		if i > 0 && len(cs) > 4 {
			cs[3], cs[4] = "RETRY", "LAST"
		}
		b.WriteString(strings.Join(cs, " | ") + "\n")
	}
	return b.String()
}

func testTop(t *testing.T, addr string, addrs []string, goldens bool) {
	r := rlfnAt(t, nil, addr, "top")
	if wantExit(t, r, exitOK, "top of none"); !strings.HasPrefix(r.stdout, "No denials published (0 processes)") {
		t.Errorf("top of none: %q", r.stdout)
	}
	wantExit(t, rlfnAt(t, nil, addr, "override", "set", "token_bucket", "cust:9", "--capacity", "1", "--rate", "1", "--period", "1h"), exitOK, "override set")
	limit := client.Limit(client.TokenBucket{Capacity: 1, Rate: 1, Period: time.Hour})
	var lims []*client.Limiter
	for range 2 {
		vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(vk.Close)
		lim, err := client.New(vk, client.Options{TopKeys: 10, TopEvery: 20 * time.Millisecond, Fallback: client.ReturnError, Deadline: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close(context.Background()) })
		lims = append(lims, lim)
	}
	ctx := context.Background()
	allow := func(lim *client.Limiter, key string, n int) {
		for range n {
			if _, err := lim.Allow(ctx, key, limit); err != nil {
				t.Fatal(err)
			}
		}
	}
	allow(lims[0], "cust:9", 6) // 1 admitted, 5 denied
	allow(lims[1], "cust:9", 2)
	allow(lims[0], "cust:3", 4)
	// AllowAll's denial counts against the rule that decided
	if res, err := lims[1].AllowAll(ctx, []client.Rule{{Key: "cust:1", Limit: client.FixedWindow{Limit: 1000, Window: time.Hour}}, {Key: "cust:3", Limit: limit}}); err != nil || res.Allowed || res.Rule != 1 {
		t.Fatalf("AllowAll: %+v, %v", res, err)
	}
	var got topJSON
	// Each process publishes on its own tick: wait for both processes' last denials.
	want := func() bool {
		return got.Processes == 2 && len(got.Keys) == 2 && got.Keys[0].Key == "cust:9" && got.Keys[0].Denials == 7 && got.Keys[0].Processes == 2 &&
			got.Keys[0].Override != nil && got.Keys[1].Key == "cust:3" && got.Keys[1].Denials == 4 && got.Keys[1].Processes == 2 && got.Keys[1].RetryAfterMs > 0
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		jsonOf(t, addr, &got, "top")
		if want() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("top --json: %+v", got)
		}
	}
	if goldens {
		r := rlfnAt(t, nil, addr, "top")
		wantExit(t, r, exitOK, "top")
		golden(t, "top.golden", topCells(r.stdout))
	}
	jsonOf(t, addr, &got, "top", "--limit", "1")
	if len(got.Keys) != 1 {
		t.Errorf("top --limit 1: %+v", got)
	}
	// a process that stops publishing is forgotten once its key expires (3 periods)
	for _, lim := range lims {
		lim.Close(ctx)
	}
	deadline := time.Now().Add(5 * time.Second)
	for got.Processes != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		jsonOf(t, addr, &got, "top")
	}
	if got.Processes != 0 {
		t.Errorf("top after every process closed: %+v", got)
	}
	wantExit(t, rlfnAt(t, nil, addr, "top", "--limit", "0"), exitError, "top --limit 0")
	wantExit(t, rlfnAt(t, nil, addr, "top", "x"), exitError, "top x")
}
