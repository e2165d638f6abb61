package llmlimit_test

import (
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/client/llmlimit"
)

// An OpenAI-compatible proxy with budgets per user and per organisation in a calendar month
// (from midnight on the 1st, Berlin time): a user may send 60 requests a minute and use 2
// million tokens a month; an organisation 500,000 tokens a minute and $500 a month, at each
// model's prices in nano-dollars (a $3 per million price is 3000 a token). Who the user is
// and which organisation it belongs to come from the service's own authentication, here
// headers a gateway in front set.
func Example() {
	vk, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer vk.Close()
	lim, err := client.New(vk, client.Options{})
	if err != nil {
		log.Fatal(err)
	}

	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		log.Fatal(err)
	}
	month := func(limit int64) client.Calendar {
		return client.Calendar{Limit: limit, Period: client.Month, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, berlin)}
	}
	header := func(name string) func(*http.Request) (string, error) {
		return func(r *http.Request) (string, error) { return r.Header.Get(name), nil }
	}
	budgets, err := llmlimit.New(lim, llmlimit.Options{
		Budgets: []llmlimit.Budget{
			{Name: "user", Key: header("X-User"),
				Requests: client.SlidingWindow{Limit: 60, Window: time.Minute},
				Tokens:   month(2_000_000)},
			{Name: "org", Key: header("X-Org"),
				Tokens: client.TokenBucket{Capacity: 500_000, Rate: 500_000, Period: time.Minute},
				Spend:  month(500_000_000_000)}, // $500
		},
		Prices: map[string]llmlimit.Price{
			"gpt-4.1":      {Input: 2000, CacheRead: 500, Output: 8000},
			"gpt-4.1-mini": {Input: 400, CacheRead: 100, Output: 1600},
		},
		QuotaStatus: http.StatusPaymentRequired, // a spent month: 402, insufficient_quota
	})
	if err != nil {
		log.Fatal(err)
	}

	upstream, _ := url.Parse("https://api.openai.com")
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(upstream)
		r.Out.Header.Set("Authorization", "Bearer "+os.Getenv("OPENAI_API_KEY"))
		r.Out.Header.Del("X-User")
		r.Out.Header.Del("X-Org")
	}}
	http.Handle("/v1/", budgets.Handler(proxy))

	// The server keys of organisation acme: rl:{org:acme}:token_bucket:tokens and
	// rl:{org:acme}:calendar:spend, and their holds beside them.
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
