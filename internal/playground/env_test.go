package playground_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/internal/playground"
	"github.com/rlfn/rlfn/versions"
)

// workingVersion is the version the working copy of the library declares, which the tests
// load: the page shows it.
var workingVersion = func() string {
	v, err := versions.Declared(functions.Source)
	if err != nil {
		panic(err)
	}
	return v
}()

// env is a playground served in front of a server of the test's own.
type env struct {
	page string        // the page's URL, on 127.0.0.1
	url  string        // the server's, as the page names it
	vk   valkey.Client // a client of the server, to look at what the page did
}

// servers are the standalone servers every API test runs on.
var servers = []struct {
	name  string
	start func(testing.TB, ...string) *harness.Server
}{{"valkey8", harness.StartValkey}, {"redis7.0", harness.StartRedis}}

// served starts a Valkey 8 of the test's own, with the working copy of the library loaded
// when loaded is true, and the playground in front of it on 127.0.0.1.
func served(t *testing.T, loaded bool) env { return servedOn(t, harness.StartValkey, loaded) }

// servedOn is served on the server start starts.
func servedOn(t *testing.T, start func(testing.TB, ...string) *harness.Server, loaded bool) env {
	t.Helper()
	s := start(t)
	vk := s.Client(t)
	if loaded {
		load(t, vk)
	}
	return serve(t, vk, "redis://"+s.Addr)
}

// load loads the working copy of the library on the server vk reaches.
func load(t *testing.T, vk valkey.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vk.Do(ctx, vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
		t.Fatalf("FUNCTION LOAD: %v", err)
	}
}

// serve puts the playground in front of vk, on 127.0.0.1.
func serve(t *testing.T, vk valkey.Client, url string) env {
	t.Helper()
	srv := httptest.NewServer(newServer(t, vk, playground.Options{Deploy: "rlfn --url '" + url + "' deploy", Server: url}))
	t.Cleanup(srv.Close)
	return env{page: srv.URL, url: url, vk: vk}
}

// newServer is playground.New in a test, which gives it a client: an error is the test's bug.
func newServer(t testing.TB, vk valkey.Client, opts playground.Options) *playground.Server {
	t.Helper()
	srv, err := playground.New(vk, opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}
