package rls_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/calendar"
	"github.com/rlfn/rlfn/internal/envoyconf"
	"github.com/rlfn/rlfn/rls"
)

const config = `
domain: edge
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value3
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: key6
    rate_limit: {unlimited: true}
  - key: named
    rate_limit: {name: strict, unit: hour, requests_per_unit: 1}
  - key: loose
    rate_limit:
      unit: hour
      requests_per_unit: 100
      replaces: [{name: strict}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: wild
    value: api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: each
    value: api/*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tb
    rate_limits:
      - {algorithm: token_bucket, unit: second, unit_multiplier: 10, requests_per_unit: 1, burst: 3}
      - {algorithm: sliding_window, unit: hour, requests_per_unit: 4}
  - key: shaped
    rate_limit: {algorithm: leaky_bucket, mode: shape, unit: second, requests_per_unit: 1, burst: 5}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: minute, requests_per_unit: 2}
  - key: cal
    rate_limit: {algorithm: calendar, unit: month, requests_per_unit: 2, time_zone: Europe/Paris}
  - key: calfuture
    rate_limit: {algorithm: calendar, unit: day, requests_per_unit: 2, anchor: "2099-01-15T06:00"}
  - key: calgap
    rate_limit: {algorithm: calendar, unit: day, requests_per_unit: 2, time_zone: Europe/Berlin, anchor: "2026-03-29T02:30"}
  - key: critical
    rate_limit: {unit: minute, requests_per_unit: 3, reserve: 1}
  - key: penalised
    rate_limit: {unit: second, requests_per_unit: 1, penalty: 1h}
  - key: conn
    descriptors:
      - key: request_id
        rate_limit: {algorithm: concurrency, unit: second, requests_per_unit: 2, lease: 1m, holder_key: request_id}
`

func TestFixedWindowAsTheReference(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		for i := range 20 {
			resp := r.ask(t, request("edge", desc("key2", "x")))
			st := resp.Statuses[0]
			if resp.OverallCode != pb.RateLimitResponse_OK || st.Code != pb.RateLimitResponse_OK || st.LimitRemaining != uint32(19-i) {
				t.Fatalf("request %d: %v", i, resp)
			}
			if st.CurrentLimit.GetRequestsPerUnit() != 20 || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetName() != "" {
				t.Fatalf("current limit %v", st.CurrentLimit)
			}
			if s := st.DurationUntilReset.GetSeconds(); s < 1 || s > 60 {
				t.Fatalf("duration_until_reset %ds", s)
			}
		}
		resp := r.ask(t, request("edge", desc("key2", "x")))
		st := resp.Statuses[0]
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || st.Code != pb.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 {
			t.Fatalf("21st: %v", resp)
		}
		// Epoch-aligned minute: the reset is the minute's end, rounded up to a second.
		want := 60 - time.Now().Unix()%60
		if s := st.DurationUntilReset.GetSeconds(); s < want-1 || s > want+1 {
			t.Fatalf("duration_until_reset %ds, want about %ds", s, want)
		}
		// Another value of key2 has its own counter; value3 is whitelisted; an unknown key
		// and an unknown domain have no limit; key6 is unlimited.
		resp = r.ask(t, request("edge", desc("key2", "y"), desc("key2", "value3"), desc("nope", "x"), desc("key6", "x")))
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 19 {
			t.Fatalf("%v", resp)
		}
		for i, st := range resp.Statuses[1:3] {
			if st.Code != pb.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != 0 || st.DurationUntilReset != nil {
				t.Errorf("status %d: %v", i+1, st)
			}
		}
		if st := resp.Statuses[3]; st.Code != pb.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != math.MaxUint32 {
			t.Errorf("unlimited: %v", st)
		}
		resp = r.ask(t, request("other", desc("key2", "x")))
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("unknown domain: %v", resp)
		}
		// A value far longer than the client takes as a key: counted by its hash.
		long := strings.Repeat("v", 4000)
		for i := range 2 {
			if resp := r.ask(t, request("edge", desc("key2", long))); resp.Statuses[0].LimitRemaining != uint32(19-i) {
				t.Fatalf("long value %d: %v", i, resp)
			}
		}
		if resp := r.ask(t, request("edge", desc("key2", long+"w"))); resp.Statuses[0].LimitRemaining != 19 {
			t.Fatalf("another long value shares its counter: %v", resp)
		}
		// Nested: the limit applies at the last entry only.
		resp = r.ask(t, request("edge", desc("key1", "value1", "subkey1", "a"), desc("key1", "value1")))
		if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 || resp.Statuses[0].LimitRemaining != 4 || resp.Statuses[1].CurrentLimit != nil {
			t.Errorf("nested: %v", resp)
		}
	})
}

func TestRequestErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		for _, tc := range []struct {
			req  *pb.RateLimitRequest
			want string
		}{
			{request("", desc("key2", "x")), "rate limit domain must not be empty"},
			{request("edge"), "rate limit descriptor list must not be empty"},
			{request("edge", desc("conn", "a", "request_id", "")), "needs the entry"},
			{request("edge", hits(desc("key2", "x"), 1<<63+5)), "hits_addend 9223372036854775813 is more than 999999999999999"},
			{request("edge", hits(desc("key2", "x"), math.MaxUint64)), "hits_addend 18446744073709551615 is more than 999999999999999"},
		} {
			_, err := r.call(tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: err %v, want InvalidArgument %q", tc.req, err, tc.want)
			}
		}
	})
}

// A refused request takes nothing from any descriptor: the reference counts it against
// every one.
func TestAllOrNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		both := request("edge", desc("big", "u"), desc("small", "u"))
		for i := range 2 {
			if resp := r.ask(t, both); resp.OverallCode != pb.RateLimitResponse_OK {
				t.Fatalf("request %d: %v", i, resp)
			}
		}
		resp := r.ask(t, both)
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != pb.RateLimitResponse_OK ||
			resp.Statuses[0].LimitRemaining != 3 || resp.Statuses[1].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("third: %v", resp)
		}
		if resp := r.ask(t, request("edge", desc("big", "u"))); resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("big took the refused request: %v", resp)
		}
		// A limit of 0 refuses the request; the other descriptor is only looked at.
		resp = r.ask(t, request("edge", desc("big", "u"), desc("closed", "u")))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 2 || resp.Statuses[1].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("closed: %v", resp)
		}
		if resp := r.ask(t, request("edge", desc("big", "u"))); resp.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("big took the request a limit of 0 refused: %v", resp)
		}
	})
}

// ChargeWhatFits: a cost known after the response (Envoy AI Gateway's tokens, charged when
// the stream is done) spends what is left of a budget instead of being refused whole, and a
// check of hits 0 is refused once the budget is spent.
func TestChargeWhatFits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{ChargeWhatFits: true})
		check := func(key, value string, want pb.RateLimitResponse_Code, left uint32) {
			t.Helper()
			resp := r.ask(t, request("edge", hits(desc(key, value), 0)))
			if resp.OverallCode != want || resp.Statuses[0].LimitRemaining != left {
				t.Fatalf("check of %s=%s: %v, want %v with %d left", key, value, resp, want, left)
			}
		}
		check("big", "u", pb.RateLimitResponse_OK, 5)
		if resp := r.ask(t, request("edge", hits(desc("big", "u"), 3))); resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("3 of 5: %v", resp)
		}
		check("big", "u", pb.RateLimitResponse_OK, 2)
		// 4 more than the 2 left: the 2 are charged, the rest refused.
		resp := r.ask(t, request("edge", hits(desc("big", "u"), 4)))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[0].DurationUntilReset.GetSeconds() < 1 {
			t.Fatalf("4 of the 2 left: %v", resp)
		}
		check("big", "u", pb.RateLimitResponse_OVER_LIMIT, 0)
		if resp := r.ask(t, request("edge", desc("big", "u"))); resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("spent: %v", resp)
		}

		// Descriptors each on their own: key2 (20) charged 20 of 30, big (5) its 3.
		resp = r.ask(t, request("edge", hits(desc("key2", "v"), 30), hits(desc("big", "v"), 3)))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[1].Code != pb.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 2 {
			t.Fatalf("30 of 20 beside 3 of 5: %v", resp)
		}
		check("key2", "v", pb.RateLimitResponse_OVER_LIMIT, 0)
		check("big", "v", pb.RateLimitResponse_OK, 2)

		// The limits of one descriptor each on their own: 5 hits on a token bucket of 3 and
		// a sliding window of 4 charge the bucket its 3 and the window its 4.
		resp = r.ask(t, request("edge", hits(desc("tb", "w"), 5)))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("5 of a bucket of 3 and a window of 4: %v", resp)
		}
		check("tb", "w", pb.RateLimitResponse_OVER_LIMIT, 0)

		// A limit of 0 refuses its descriptor; the other is still charged.
		resp = r.ask(t, request("edge", hits(desc("big", "z"), 2), desc("closed", "z")))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != pb.RateLimitResponse_OK ||
			resp.Statuses[0].LimitRemaining != 3 || resp.Statuses[1].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("beside a limit of 0: %v", resp)
		}
		// A budget of 0 has nothing left: its check is refused too.
		if resp := r.ask(t, request("edge", hits(desc("closed", "z"), 0))); resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("a check of a limit of 0: %v", resp)
		}

		// A request with a concurrency limit is all or nothing: 9 of big's 5 take nothing.
		resp = r.ask(t, request("edge", hits(desc("big", "q"), 9), desc("conn", "q", "request_id", "r1")))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("beside a concurrency limit: %v", resp)
		}
		check("big", "q", pb.RateLimitResponse_OK, 5)

		// Charges at once never take more than the limit, and fill it: 20 charges of 3 on a
		// limit of 20 are 6 admitted whole and one charged the 2 left.
		var wg sync.WaitGroup
		var ok atomic.Int32
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if resp := r.ask(t, request("edge", hits(desc("key2", "c"), 3))); resp.OverallCode == pb.RateLimitResponse_OK {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 6 {
			t.Fatalf("%d of 20 charges of 3 on a limit of 20 admitted, want 6", ok.Load())
		}
		check("key2", "c", pb.RateLimitResponse_OVER_LIMIT, 0)

		// Without it, all or nothing: 4 of the 2 left take nothing, and hits 0 is OK.
		plain := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		plain.ask(t, request("edge", hits(desc("big", "u"), 3)))
		if resp := plain.ask(t, request("edge", hits(desc("big", "u"), 4))); resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("all or nothing: %v", resp)
		}
		if resp := plain.ask(t, request("edge", hits(desc("big", "u"), 0))); resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("all or nothing, then a check: %v", resp)
		}
	})
}

// Envoy sends one descriptor twice when two actions of a route make the same: both are one
// limit's, decided together with their hits added up (a client error before).
func TestDuplicateDescriptors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		twice := request("edge", desc("big", "dup"), desc("key2", "dup"), desc("big", "dup"))
		for i, want := range []uint32{3, 1} {
			resp := r.ask(t, twice)
			if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != want || resp.Statuses[2].LimitRemaining != want {
				t.Fatalf("request %d: %v, want OK and %d left", i, resp, want)
			}
		}
		// Two more are one over: refused, and nothing taken.
		resp := r.ask(t, twice)
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[2].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("over: %v", resp)
		}
		if resp := r.ask(t, request("edge", desc("big", "dup"))); resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("the refused request took: %v", resp)
		}
	})
}

// Values a proxy passes on from its clients: the characters of key syntax (hash tags,
// escapes, separators), unicode and control characters, each value its own counter, never
// another's; and thousands of descriptors in one request, each decided.
func TestHostileDescriptors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		values := []string{"a}b", "a%7Db", "a%257Db", "{a}", "{", "}", "%", "%25", ":", "a:b", "a/b=c", "a%2Fb%3Dc",
			"日本語", "é", "e\u0301", "\x00", "\x00\x00", "\n", " ", ""}
		for i, v := range values {
			if resp := r.ask(t, request("edge", desc("key2", v))); resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 19 {
				t.Fatalf("value %d %q shares a counter: %v", i, v, resp)
			}
		}
		// A key and a domain with the same characters.
		resp := r.ask(t, request("edge", desc("{key2}", "x"), desc("key2", "{x}:%")))
		if resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].LimitRemaining != 19 {
			t.Fatalf("%v", resp)
		}
		if resp := r.ask(t, request("{edge}", desc("key2", "x"))); resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unknown domain: %v", resp)
		}
		many := request("edge")
		for i := range rls.DefaultMaxDescriptors {
			many.Descriptors = append(many.Descriptors, desc("key2", fmt.Sprint("many", i)))
		}
		resp = r.ask(t, many)
		if resp.OverallCode != pb.RateLimitResponse_OK || len(resp.Statuses) != rls.DefaultMaxDescriptors {
			t.Fatalf("%v statuses %d", resp.OverallCode, len(resp.Statuses))
		}
		for i, st := range resp.Statuses {
			if st.LimitRemaining != 19 {
				t.Fatalf("descriptor %d: %v", i, st)
			}
		}
	})
}

func TestHitsAddend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		req := request("edge", desc("key2", "h"), hits(desc("big", "h"), 0))
		req.HitsAddend = 7
		resp := r.ask(t, req)
		if resp.Statuses[0].LimitRemaining != 13 || resp.Statuses[1].LimitRemaining != 5 {
			t.Fatalf("request hits 7, descriptor hits 0: %v", resp)
		}
		// The request's largest hits_addend is over any limit here: refused, and nothing
		// taken (the next request takes the 13 left).
		big := request("edge", desc("key2", "h"))
		big.HitsAddend = math.MaxUint32
		if resp := r.ask(t, big); resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("request hits %d: %v", big.HitsAddend, resp)
		}
		// A descriptor's hits_addend over the request's; 0 at the request is 1.
		resp = r.ask(t, request("edge", hits(desc("key2", "h"), 13), desc("big", "h")))
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[1].LimitRemaining != 4 {
			t.Fatalf("%v", resp)
		}
		// hits 0 on a spent limit decides without taking, and is admitted (nothing is over).
		resp = r.ask(t, request("edge", hits(desc("key2", "h"), 0)))
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("hits 0: %v", resp)
		}
		resp = r.ask(t, request("edge", desc("key2", "h")))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("spent: %v", resp)
		}
		// Refunds: is_negative_hits gives units back.
		d := hits(desc("key2", "h"), 5)
		d.IsNegativeHits = true
		resp = r.ask(t, request("edge", d))
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 5 {
			t.Fatalf("refund: %v", resp)
		}
		if resp := r.ask(t, request("edge", desc("key2", "h"))); resp.Statuses[0].LimitRemaining != 4 {
			t.Fatalf("after the refund: %v", resp)
		}
	})
}

func TestModes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		// shadow_mode: over the limit, still OK.
		for i := range 3 {
			resp := r.ask(t, request("edge", desc("shadow", "s")))
			if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].Code != pb.RateLimitResponse_OK {
				t.Fatalf("shadow %d: %v", i, resp)
			}
		}
		// quota_mode: refused only when every quota descriptor is over.
		q := request("edge", desc("quota1", "q"), desc("quota2", "q"))
		for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
			resp := r.ask(t, q)
			if resp.OverallCode != want {
				t.Fatalf("quota %d: %v, want %v", i, resp, want)
			}
		}
		// replaces: the named limit is dropped when a descriptor replacing it is present.
		for i := range 3 {
			resp := r.ask(t, request("edge", desc("named", "n"), desc("loose", "n")))
			if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
				t.Fatalf("replaced %d: %v", i, resp)
			}
		}
		resp := r.ask(t, request("edge", desc("named", "n")))
		if resp.Statuses[0].CurrentLimit.GetName() != "strict" || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("named: %v", resp)
		}
		// share_threshold: every value the wildcard matches shares one counter.
		for i, v := range []string{"api/a", "api/b", "api/c", "api/d"} {
			resp := r.ask(t, request("edge", desc("wild", v)))
			if (i < 3) != (resp.OverallCode == pb.RateLimitResponse_OK) {
				t.Fatalf("shared %s: %v", v, resp)
			}
			resp = r.ask(t, request("edge", desc("each", v)))
			if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("not shared %s: %v", v, resp)
			}
		}
	})
}

func TestExtensions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
		// A token bucket of 3, one per 10 s, beside a sliding window of 4 an hour.
		for i := range 3 {
			resp := r.ask(t, request("edge", desc("tb", "t")))
			if resp.OverallCode != pb.RateLimitResponse_OK {
				t.Fatalf("tb %d: %v", i, resp)
			}
		}
		resp := r.ask(t, request("edge", desc("tb", "t")))
		st := resp.Statuses[0]
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 1 ||
			st.CurrentLimit.GetUnitMultiplier().GetValue() != 10 || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_SECOND {
			t.Fatalf("tb 4: %v", resp)
		}
		// The real wait for one token, rounded up: at most 10 s.
		if s := st.DurationUntilReset.GetSeconds(); s < 1 || s > 10 {
			t.Fatalf("tb retry %ds", s)
		}
		// A sliding log of 2 a minute.
		for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
			if resp := r.ask(t, request("edge", desc("log", "l"))); resp.OverallCode != want {
				t.Fatalf("log %d: %v", i, resp)
			}
		}
		// A calendar month of 2.
		for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
			resp := r.ask(t, request("edge", desc("cal", "c")))
			if resp.OverallCode != want || resp.Statuses[0].CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MONTH {
				t.Fatalf("calendar %d: %v", i, resp)
			}
		}
		// Calendars whose anchor is in the future (it sets the phase: the day from 06:00 UTC
		// that holds now), or on the day Berlin skips its clock time (windows start at 02:30
		// on every day that has it): the denial waits for that window's end.
		berlin, err := time.LoadLocation("Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			key    string
			anchor time.Time // one of the same phase on a day that has its clock time
		}{
			{"calfuture", time.Date(2020, 1, 15, 6, 0, 0, 0, time.UTC)},
			{"calgap", time.Date(2026, 3, 28, 2, 30, 0, 0, berlin)},
		} {
			var resp *pb.RateLimitResponse
			for range 3 {
				resp = r.ask(t, request("edge", desc(c.key, "c")))
			}
			end, err := calendar.Windows(calendar.Day, c.anchor, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			left := time.Until(time.UnixMilli(end[2])).Seconds()
			if got := float64(resp.Statuses[0].DurationUntilReset.GetSeconds()); resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || got < left-2 || got > left+2 {
				t.Fatalf("%s: %v, want over the limit until the window's end in about %.0fs (%s)", c.key, resp, left, time.UnixMilli(end[2]))
			}
		}
		// A shaped leaky bucket admits a burst.
		if resp := r.ask(t, request("edge", desc("shaped", "s"))); resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("shaped: %v", resp)
		}
		// A penalty: the second request in a second blocks the principal for an hour.
		r.ask(t, request("edge", desc("penalised", "p")))
		r.ask(t, request("edge", desc("penalised", "p")))
		resp = r.ask(t, request("edge", desc("penalised", "p")))
		if resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].DurationUntilReset.GetSeconds() < 3500 {
			t.Fatalf("penalised: %v", resp)
		}
		// Concurrency: two holders at once; the third waits for a release.
		for i, id := range []string{"r1", "r2"} {
			resp := r.ask(t, request("edge", desc("conn", "c", "request_id", id)))
			if resp.OverallCode != pb.RateLimitResponse_OK {
				t.Fatalf("acquire %s: %v", id, resp)
			}
			// A granted lease says its limit and what is left, as a refused one does.
			if st := resp.Statuses[0]; st.CurrentLimit.GetRequestsPerUnit() != 2 || st.LimitRemaining != uint32(1-i) {
				t.Fatalf("acquire %s: status %v", id, st)
			}
		}
		if resp := r.ask(t, request("edge", desc("conn", "c", "request_id", "r3"))); resp.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("third holder: %v", resp)
		}
		done := desc("conn", "c", "request_id", "r1")
		done.IsNegativeHits = true
		if resp := r.ask(t, request("edge", done)); resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("release: %v", resp)
		}
		if resp := r.ask(t, request("edge", desc("conn", "c", "request_id", "r3"))); resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("after the release: %v", resp)
		}
	})
}

func TestHTTPJSONAndHealth(t *testing.T) {
	b := backends(t)[0]
	r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{Headers: rls.ReferenceHeaders})
	waitHealth(t, r, healthpb.HealthCheckResponse_SERVING)
	post := func(body string) (int, map[string]any) {
		resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var out map[string]any
		_ = json.Unmarshal(data, &out)
		return resp.StatusCode, out
	}
	body := `{"domain": "edge", "descriptors": [{"entries": [{"key": "small", "value": "j"}]}]}`
	for i, want := range []int{200, 200, 429} {
		code, out := post(body)
		if code != want {
			t.Fatalf("request %d: %d %v", i, code, out)
		}
		if i == 2 && (out["overallCode"] != "OVER_LIMIT" || len(out["responseHeadersToAdd"].([]any)) != 3) {
			t.Fatalf("over limit: %v", out)
		}
	}
	if code, _ := post(`{"domain": 3}`); code != 400 {
		t.Errorf("bad JSON: %d", code)
	}
	// A body over the bound is refused as such, not as JSON cut short.
	huge := `{"domain": "edge", "descriptors": [{"entries": [{"key": "small", "value": "` + strings.Repeat("x", rls.DefaultMaxRequestBytes) + `"}]}]}`
	resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(huge))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(data), "request body larger than 65536 bytes (--max-request-bytes)") {
		t.Errorf("huge body: %d %s", resp.StatusCode, data)
	}
	resp, err = http.Get(r.http + "/healthcheck")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthcheck: %v %v", resp, err)
	}
	resp.Body.Close()
}

// A client that sends its body slowly is cut after the read timeout rather than holding
// its connection (and a goroutine) for ever.
func TestHTTPSlowClient(t *testing.T) {
	b := backends(t)[0]
	rls.SetHTTPReadTimeout(200 * time.Millisecond)
	defer rls.SetHTTPReadTimeout(10 * time.Second)
	r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.http, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"domain\""); err != nil {
		t.Fatal(err)
	}
	// Only a bound on a hang: without a read timeout the server never closes.
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("the server kept the connection of a client that stopped sending: %v", err)
	}
}

// The library gone from the server: every request is a gRPC error (Envoy's
// failure_mode_deny decides), and health turns NOT_SERVING until it is back.
func TestBackendFailure(t *testing.T) {
	b := backends(t)[0]
	r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
	waitHealth(t, r, healthpb.HealthCheckResponse_SERVING)
	ctx := context.Background()
	if err := b.vk.Do(ctx, b.vk.B().FunctionDelete().LibraryName("ratelimit").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := loadLibrary(ctx, b.vk); err != nil {
			t.Fatal(err)
		}
	}()
	_, err := r.call(request("edge", desc("key2", "x")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err %v, want Unavailable", err)
	}
	waitHealth(t, r, healthpb.HealthCheckResponse_NOT_SERVING)
	if err := loadLibrary(ctx, b.vk); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, r, healthpb.HealthCheckResponse_SERVING)
	if resp := r.ask(t, request("edge", desc("key2", "x"))); resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("%v", resp)
	}
}

func waitHealth(t *testing.T, r *rig, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last healthpb.HealthCheckResponse_ServingStatus
	for time.Now().Before(deadline) {
		resp, err := r.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err == nil && resp.Status == want {
			return
		}
		last = resp.GetStatus()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("health %v, want %v", last, want)
}

// A changed file is reloaded; a bad one keeps the previous configuration.
func TestReload(t *testing.T) {
	b := backends(t)[0]
	r := newRig(t, b, config, client.Options{}, rls.ServerOptions{}, rls.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	files := rls.Files{Paths: []string{r.dir}}
	go func() { _ = rls.Watch(ctx, files, r.svc, nil, nil, 50*time.Millisecond) }()
	time.Sleep(100 * time.Millisecond) // the watcher is set up
	path := filepath.Join(r.dir, "config.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	limitOf := func() uint32 {
		return r.ask(t, request("edge", hits(desc("key2", "r"), 0))).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	write(strings.Replace(config, "requests_per_unit: 20", "requests_per_unit: 40", 1))
	eventually(t, func() bool { return limitOf() == 40 })
	write(strings.Replace(config, "requests_per_unit: 20}", "requests_per_unit: 20, bogus: 1}", 1))
	time.Sleep(300 * time.Millisecond)
	if got := limitOf(); got != 40 {
		t.Fatalf("a bad file changed the limit to %d", got)
	}
	write(config)
	eventually(t, func() bool { return limitOf() == 20 })
}

func eventually(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("never")
}

// With MaxInFlight requests stalled on the backend, one more is refused at once rather than
// queued; the stalled one is answered when the backend is back.
func TestInFlightBound(t *testing.T) {
	b := backends(t)[0]
	r := newRig(t, b, config, client.Options{Deadline: 5 * time.Second}, rls.ServerOptions{MaxInFlight: 1}, rls.Options{})
	ctx := context.Background()
	// Writes (every decision) wait; reads (the health check) go on.
	if err := b.vk.Do(ctx, b.vk.B().ClientPause().Timeout(1500).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		_, err := r.call(request("edge", desc("key2", "stalled")))
		first <- err
	}()
	time.Sleep(300 * time.Millisecond) // the first is in flight: the pause lasts 1.5 s
	_, err := r.call(request("edge", desc("key2", "second")))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second request: %v, want ResourceExhausted", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the stalled request: %v", err)
	}
	if resp := r.ask(t, request("edge", desc("key2", "second"))); resp.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("after the stall: %v", resp)
	}
}

// A domain's own policy: with the library gone, the domain whose fallback is FailOpen admits
// where the others, under the base ReturnError, fail.
func TestDomainPolicy(t *testing.T) {
	b := backends(t)[0]
	cfg, err := envoyconf.Load([]envoyconf.File{{Name: "c", Data: []byte(config)}, {Name: "o", Data: []byte(strings.Replace(config, "domain: edge", "domain: open", 1))}}, false)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := rls.NewLimiters(b.vk, client.Options{Prefix: fmt.Sprintf("rlspolicy:%d:", time.Now().UnixNano()), Fallback: client.ReturnError},
		map[string]rls.Policy{"open": {Fallback: client.FailOpen, HasFallback: true, Deadline: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close(context.Background())
	svc := rls.NewService(ls.For, cfg, rls.Options{})
	ctx := context.Background()
	if err := ls.Check(ctx, cfg.Needs()); err != nil {
		t.Fatal(err)
	}
	if err := b.vk.Do(ctx, b.vk.B().FunctionDelete().LibraryName("ratelimit").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := loadLibrary(ctx, b.vk); err != nil {
			t.Fatal(err)
		}
	}()
	if ls.Check(ctx, cfg.Needs()) == nil {
		t.Fatal("Check passes without the library")
	}
	resp, err := svc.ShouldRateLimit(ctx, request("open", desc("key2", "x")))
	if err != nil || resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 19 {
		t.Fatalf("fail open: %v %v", resp, err)
	}
	if _, err := svc.ShouldRateLimit(ctx, request("edge", desc("key2", "x"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("return error: %v", err)
	}
}

// The reference's global shadow mode: OK overall, the statuses as they are.
func TestGlobalShadowMode(t *testing.T) {
	r := newRig(t, backends(t)[0], config, client.Options{}, rls.ServerOptions{}, rls.Options{ShadowMode: true})
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp := r.ask(t, request("edge", desc("small", "g")))
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].Code != want {
			t.Fatalf("request %d: %v", i, resp)
		}
	}
}

// Shutdown lets a request in flight finish: stalled on the backend, it is answered, not cut.
func TestGracefulShutdown(t *testing.T) {
	b := backends(t)[0]
	r := newRig(t, b, config, client.Options{Deadline: 5 * time.Second}, rls.ServerOptions{}, rls.Options{})
	ctx := context.Background()
	if err := b.vk.Do(ctx, b.vk.B().ClientPause().Timeout(800).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := r.call(request("edge", desc("key2", "late")))
		answered <- err
	}()
	time.Sleep(200 * time.Millisecond)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := r.srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatalf("Shutdown returned after %v, before the request in flight was answered", time.Since(start))
	}
	if _, err := r.call(request("edge", desc("key2", "after"))); err == nil {
		t.Fatal("answered after Shutdown")
	}
}
