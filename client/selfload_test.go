package client_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/versions"
)

// With Options.LoadLibrary, a node that answers it has no library is sent exactly FUNCTION
// LOAD and the embedded source, without REPLACE (a library that exists is never replaced),
// once however many calls find it missing within 10 seconds; without it, nothing is sent.
func TestLoadLibrarySendsFunctionLoad(t *testing.T) {
	for _, on := range []bool{false, true} {
		clock := newFakeClock()
		vk := mock.NewClient(gomock.NewController(t))
		vk.EXPECT().Nodes().Return(map[string]valkey.Client{"127.0.0.1:6379": vk}).AnyTimes()
		lim := newLimiter(t, vk, client.WithClock(client.Options{LoadLibrary: on}, clock.now))
		loads := make(chan []string, 10)
		vk.EXPECT().Do(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd valkey.Completed) valkey.ValkeyResult {
			if c := cmd.Commands(); c[0] == "FUNCTION" {
				loads <- c
				return mock.Result(mock.ValkeyString("ratelimit"))
			}
			return missing
		}).AnyTimes()
		for range 3 {
			if res, err := lim.Allow(context.Background(), "k", client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}); err != nil || res.Source != client.FromFallback {
				t.Fatalf("Allow: %+v, %v", res, err)
			}
		}
		select {
		case got := <-loads:
			if !on {
				t.Fatalf("LoadLibrary off sent %v", got[:2])
			}
			if want := []string{"FUNCTION", "LOAD", versions.Embedded().Latest().Code}; !slices.Equal(got, want) {
				t.Errorf("sent %q..., want FUNCTION LOAD <source>, without REPLACE", got[:min(len(got), 3)])
			}
		case <-time.After(map[bool]time.Duration{false: 300 * time.Millisecond, true: 5 * time.Second}[on]):
			if on {
				t.Fatal("LoadLibrary on sent no FUNCTION LOAD")
			}
		}
		select {
		case got := <-loads:
			t.Errorf("a second FUNCTION LOAD within 10s: %q", got[:2])
		case <-time.After(200 * time.Millisecond):
		}
	}
}
