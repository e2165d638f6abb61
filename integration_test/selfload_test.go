package integration_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/versions"
)

// Options.LoadLibrary on a real node without the library: as a user whose ACL refuses
// FUNCTION LOAD, the call goes to the fallback, the log says why the load failed (NOPERM), and
// the node still has no library; as one that may, the Limiter loads the library it embeds,
// says so, and the server decides the calls after it. Without the option, nothing is loaded.
func TestLoadLibrary(t *testing.T) {
	s := harness.StartValkey(t)
	admin := s.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, admin.B().AclSetuser().Username("svc").Rule("on", ">pw", "~*", "+@all", "-function|load").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	limit := client.FixedWindow{Limit: 10, Window: time.Minute}
	limiter := func(user, pass string, load bool) (*client.Limiter, *harness.Buffer) {
		t.Helper()
		vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, Username: user, Password: pass, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(vk.Close)
		var out harness.Buffer
		lim, err := client.New(vk, client.Options{LoadLibrary: load, Logger: slog.New(slog.NewTextHandler(&out, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return lim, &out
	}
	waitLog := func(out *harness.Buffer, want string) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if got := out.String(); strings.Contains(got, want) {
				return got
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("the log does not say %q:\n%s", want, out.String())
		return ""
	}
	library := func() string {
		t.Helper()
		code, err := harness.LibraryCode(ctx, admin, "ratelimit")
		if err != nil {
			t.Fatal(err)
		}
		return code
	}

	off, offLog := limiter("", "", false)
	if res, err := off.Allow(ctx, "k", limit); err != nil || res.Source != client.FromFallback {
		t.Fatalf("without the library: %+v, %v", res, err)
	}
	waitLog(offLog, "event=library_missing")
	time.Sleep(300 * time.Millisecond)
	if library() != "" || strings.Contains(offLog.String(), "library_loaded") {
		t.Fatalf("without LoadLibrary the library was loaded:\n%s", offLog.String())
	}

	refused, refusedLog := limiter("svc", "pw", true)
	if res, err := refused.Allow(ctx, "k", limit); err != nil || res.Source != client.FromFallback {
		t.Fatalf("without the library: %+v, %v", res, err)
	}
	got := waitLog(refusedLog, "event=library_loaded")
	if !strings.Contains(got, "could not load the library onto the node") || !strings.Contains(got, "NOPERM") || !strings.Contains(got, "node="+s.Addr) {
		t.Errorf("a user without FUNCTION LOAD: the log does not say why, naming the node:\n%s", got)
	}
	if library() != "" {
		t.Fatal("a user without FUNCTION LOAD loaded the library")
	}

	lim, log := limiter("", "", true)
	if res, err := lim.Allow(ctx, "k", limit); err != nil || res.Source != client.FromFallback {
		t.Fatalf("without the library: %+v, %v", res, err)
	}
	got = waitLog(log, "loaded the library this service embeds onto the node")
	if !strings.Contains(got, "event=library_loaded") || !strings.Contains(got, "node="+s.Addr) || !strings.Contains(got, "rlfn deploy") {
		t.Errorf("the log does not say what was loaded where:\n%s", got)
	}
	if library() != versions.Embedded().Latest().Code {
		t.Fatal("the library on the node is not the newest embedded release")
	}
	if res, err := lim.Allow(ctx, "k", limit); err != nil || res.Source != client.FromServer {
		t.Errorf("after the load: %+v, %v", res, err)
	}
}
