package httplimit_test

import (
	"errors"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/httplimit"
)

func Example() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	limits, err := httplimit.New(client.New(vk), httplimit.Options{
		// Count requests per API key; a request without one is answered 400.
		Key: func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				return k, nil
			}
			return "", errors.New("no API key")
		},
		// Per route: uploads are shaped to 2 a second, queued up to 5 seconds; everything
		// else gets bursts of 100 and 10 a second; health checks are not limited.
		Policy: func(r *http.Request) httplimit.Policy {
			switch {
			case r.URL.Path == "/healthz":
				return httplimit.Policy{}
			case strings.HasPrefix(r.URL.Path, "/upload"):
				return httplimit.Policy{Name: "upload", Limit: client.LeakyBucket{
					Capacity: 10, Rate: 2, Period: time.Second, Mode: client.Shape}}
			}
			return httplimit.Policy{Name: "api", Limit: client.TokenBucket{
				Capacity: 100, Rate: 10, Period: time.Second}}
		},
		MaxDelay: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}

// A payment route holds a concurrency lease for the whole request: at most 20 payments of one
// API key in flight, 4 of them kept for the critical route (refunds to customers), which may
// use them all; other routes stop at 16.
func Example_concurrency() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()

	inFlight := &client.Concurrency{Limit: 20, Lease: 30 * time.Second, Reserve: 4}
	limits, err := httplimit.New(client.New(vk), httplimit.Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil },
		Policy: func(r *http.Request) httplimit.Policy {
			return httplimit.Policy{
				Name:        "payments",
				Limit:       client.TokenBucket{Capacity: 100, Rate: 25, Period: time.Second, Reserve: 20},
				Concurrency: inFlight,
				Critical:    r.URL.Path == "/refunds",
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("paid\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limits.Handler(mux)))
}
