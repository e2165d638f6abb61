package llmlimit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// discardWriter is a ResponseWriter that keeps nothing: the benchmark measures the middleware.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// BenchmarkStream is the middleware's own cost for a streamed response of 100 events of each
// API (parsing each event, counting its text, a Take within the hold, passing it on and
// flushing), around a meter that costs nothing: per event, and per request (reading the body,
// the estimate, the headers, the settlement).
func BenchmarkStream(b *testing.B) {
	for _, bb := range []struct {
		name, path, body string
	}{
		{"chat", "/v1/chat/completions", chatBody("gpt-x", 1000, true, true, prompt)},
		{"responses", "/v1/responses", responsesBody("gpt-x", 1000, true, prompt)},
		{"messages", "/v1/messages", messagesBody("claude-x", 1000, true, prompt)},
	} {
		b.Run(bb.name, func(b *testing.B) {
			const words = 100
			req := mustParseB(b, bb.path, bb.body)
			events := streamed(req.API, req, words, Usage{Input: 8, Output: words}, false)
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				for _, ev := range events {
					io.WriteString(w, ev)
				}
			})
			m, err := newMiddleware(&free{}, Options{Budgets: []Budget{{Name: "org", Key: orgKey, Requests: hourly, Tokens: hourly}}})
			if err != nil {
				b.Fatal(err)
			}
			h := m.Handler(next)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				r := httptest.NewRequest("POST", bb.path, strings.NewReader(bb.body))
				r.Header.Set("X-Org", "acme")
				h.ServeHTTP(&discardWriter{h: http.Header{}}, r)
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*len(events)), "ns/event")
		})
	}
}

func mustParseB(b *testing.B, path, body string) *Request {
	r, err := ParseRequest(ByPath(httptest.NewRequest("POST", path, nil)), []byte(body))
	if err != nil {
		b.Fatal(err)
	}
	return r
}
