package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/internal/harness"
)

// TestCoverageGaps: the cluster changes shape between releases, and status and diff say
// what that does to the library. A node joined with CLUSTER MEET, owning no slots and no
// library, is a warning (empty-primary); given a slot with CLUSTER SETSLOT it is a problem:
// status and diff exit 1 with one line saying what to run, in the table, the JSON and stderr;
// rlfn deploy fixes it. A primary with no replica replaced by an empty node that takes its
// slots (CLUSTER ADDSLOTS) is the same problem, and deploy fixes it too.
func TestCoverageGaps(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	c := harness.StartCluster(t, 3, 0)
	set := testReleases(t)
	latest := set.Latest().Version
	seed := c.Primaries[0].Addr
	wantExit(t, rlfnAt(t, set, seed, "deploy", "--yes"), exitOK, "the first deploy")

	joined := c.MeetPrimary(t)
	r := rlfnAt(t, set, seed, "status")
	wantExit(t, r, exitWarnings, "status with a primary joined with no slots")
	if !strings.Contains(r.stdout, "Warning: "+joined.Addr+": primary owns no slots and has no library while the other primaries run "+latest) {
		t.Errorf("status does not warn of %s:\n%s", joined.Addr, r.stdout)
	}
	wantExit(t, rlfnAt(t, set, seed, "--accept-warning", "empty-primary", "status"), exitOK, "status accepting empty-primary")

	// The repro: one slot, with no key, given to the new node.
	ctx := t.Context()
	if err := c.MoveSlots(ctx, c.Primaries[0], joined, 0, 0); err != nil {
		t.Fatal(err)
	}
	wantGap := func(what string, gap *harness.Server, slots int) {
		t.Helper()
		line := "rlfn: " + gap.Addr + " owns "
		r := rlfnAt(t, set, seed, "--accept-warning", "empty-primary", "status")
		wantExit(t, r, exitError, "status "+what)
		if !strings.HasPrefix(r.stderr, line) || !strings.HasSuffix(r.stderr, "run rlfn deploy --to "+latest+"\n") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("status %s: stderr %q, want one line naming %s and what to run", what, r.stderr, gap.Addr)
		}
		if !slices.ContainsFunc(strings.Split(r.stdout, "\n"), func(l string) bool {
			return strings.HasPrefix(l, gap.Addr) && strings.Contains(l, "absent: owns slots and has no library")
		}) {
			t.Errorf("status %s: the table does not say so:\n%s", what, r.stdout)
		}
		r = rlfnAt(t, set, seed, "status", "--json")
		wantExit(t, r, exitError, "status --json "+what)
		var rows []statusRow
		if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
			t.Fatalf("status --json: %v\n%s", err, r.stdout)
		}
		for _, row := range rows {
			if (row.Gap != "") != (row.Addr == gap.Addr) || row.Addr == gap.Addr && row.Slots != slots {
				t.Errorf("status --json %s: %+v", what, row)
			}
		}
		r = rlfnAt(t, set, seed, "diff", "--json")
		wantExit(t, r, exitError, "diff --json "+what)
		var d diffJSON
		if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
			t.Fatalf("diff --json: %v\n%s", err, r.stdout)
		}
		if len(d.Gaps) != 1 || d.Gaps[0].Addr != gap.Addr || d.Gaps[0].Want != latest || d.Gaps[0].Slots != slots {
			t.Errorf("diff --json %s: gaps %+v", what, d.Gaps)
		}
		if !strings.HasPrefix(r.stderr, line) {
			t.Errorf("diff %s: stderr %q", what, r.stderr)
		}
		wantExit(t, rlfnAt(t, set, seed, "deploy", "--yes"), exitOK, "deploy "+what)
		wantExit(t, rlfnAt(t, set, seed, "status"), exitOK, "status after the deploy "+what)
		wantExit(t, rlfnAt(t, set, seed, "diff"), exitOK, "diff after the deploy "+what)
	}
	wantGap("with a joined primary given a slot", joined, 1)

	// A primary with no replica dies; an empty node takes its slots.
	victim := c.Primaries[1]
	slots, err := victim.Slots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fresh := c.ReplacePrimary(t, victim)
	seed = fresh.Addr // any seed: the replacement itself
	wantGap("with a dead primary replaced by an empty node", fresh, slots)

	// rlfn reconcile heals the same gap by itself, serves its metrics, and ends cleanly
	// when its context ends (SIGTERM's, in run).
	another := c.MeetPrimary(t)
	// The first of the victim's slots (the harness gives each primary a third, in order),
	// which fresh took over.
	const slot = 16384 / 3
	if err := c.MoveSlots(ctx, fresh, another, slot, slot); err != nil {
		t.Fatal(err)
	}
	wantExit(t, rlfnAt(t, set, seed, "status"), exitError, "status before reconcile")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := l.Addr().String()
	l.Close()
	app := New()
	app.Metadata[releasesKey] = set
	var stdout, stderr harness.Buffer
	app.Reader, app.Writer, app.ErrWriter = strings.NewReader(""), &stdout, &stderr
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- runApp(rctx, app, []string{"rlfn", "--url", "redis://" + seed, "reconcile", "--interval", "200ms", "--metrics", metrics})
	}()
	waitLibrary(t, another, set.Latest().Code)
	wantExit(t, rlfnAt(t, set, seed, "status"), exitOK, "status after reconcile")
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^rlfn_reconcile_loads_total\{.*outcome="loaded".*\} 1$`).Match(body) ||
		!strings.Contains(string(body), "rlfn_reconcile_missing{") {
		t.Errorf("/metrics does not count the load:\n%s", body)
	}
	stop()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("reconcile ended with exit %d:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reconcile did not end with its context")
	}
	if log := stderr.String(); !strings.Contains(log, `"msg":"library loaded","node":"`+another.Addr+`"`) || !strings.Contains(log, `"msg":"reconciler stopped"`) {
		t.Errorf("reconcile's log:\n%s", log)
	}
}
