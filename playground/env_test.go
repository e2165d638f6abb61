package playground_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
	"github.com/rlfn/rlfn/integration_test/harness"
	"github.com/rlfn/rlfn/playground"
)

// env is a playground served in front of a Valkey of the test's own.
type env struct {
	page string        // the page's URL, on 127.0.0.1
	url  string        // the server's, as the page names it
	vk   valkey.Client // a client of the server, to look at what the page did
}

// served starts a Valkey 8 of the test's own, with the working copy of the library loaded
// when loaded is true, and the playground in front of it on 127.0.0.1.
func served(t *testing.T, loaded bool) env {
	t.Helper()
	s := harness.StartValkey(t)
	vk := s.Client(t)
	if loaded {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := vk.Do(ctx, vk.B().FunctionLoad().Replace().FunctionCode(functions.Source).Build()).Error(); err != nil {
			t.Fatalf("FUNCTION LOAD: %v", err)
		}
	}
	url := "redis://" + s.Addr
	srv := httptest.NewServer(playground.New(vk, playground.Options{Deploy: "rlfn --url '" + url + "' deploy", Server: url}))
	t.Cleanup(srv.Close)
	return env{page: srv.URL, url: url, vk: vk}
}
