package rls_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf/reference"
	"github.com/rlfn/rlfn/internal/harness"
	"github.com/rlfn/rlfn/rls"
)

// A file the reference refuses, rlfn refuses with the same message; a file it loads, rlfn
// loads; rlfn's extensions are refused by the reference as unknown keys.
func TestReferenceLoadErrors(t *testing.T) {
	bin := reference.Bin(t)
	for dir, src := range map[string]string{
		"reference": reference.Configs(t),
		"rlfn":      filepath.Join("..", "internal", "envoyconf", "testdata", "rlfn"),
	} {
		entries, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if filepath.Ext(e.Name()) != ".yaml" {
				continue
			}
			t.Run(dir+"/"+e.Name(), func(t *testing.T) {
				data, err := os.ReadFile(filepath.Join(src, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				cfgDir := t.TempDir()
				path := filepath.Join(cfgDir, e.Name())
				if err := os.WriteFile(path, data, 0o644); err != nil {
					t.Fatal(err)
				}
				out, refErr := exec.Command(filepath.Join(bin, "config_check_cmd"), "-config_dir", cfgDir).CombinedOutput()
				_, ourErr := rls.Files{Paths: []string{cfgDir}, EveryFile: true}.Load()
				switch {
				case dir == "rlfn":
					if refErr == nil || !bytes.Contains(out, []byte("config error, unknown key")) {
						t.Fatalf("the reference does not refuse an extension as an unknown key:\n%s", out)
					}
					if ourErr != nil {
						t.Fatalf("rlfn refuses its extension: %v", ourErr)
					}
				case refErr == nil && ourErr != nil:
					t.Fatalf("the reference loads it, rlfn refuses it: %v", ourErr)
				case refErr != nil && ourErr == nil:
					t.Fatalf("the reference refuses it, rlfn loads it:\n%s", out)
				case refErr != nil:
					// Same message, except for a YAML syntax error, whose words are each YAML
					// parser's own.
					msg := ourErr.Error()
					if strings.Contains(msg, "error loading config file: ") {
						msg = msg[:strings.Index(msg, "error loading config file: ")+len("error loading config file: ")]
					}
					if !bytes.Contains(out, []byte(msg)) {
						t.Fatalf("rlfn: %s\nreference:\n%s", ourErr, out)
					}
				}
			})
		}
	}
}

// referenceService runs the reference on loopback with config, against b, and returns a
// client of its gRPC service. Its keys have a prefix of their own.
func referenceService(t testing.TB, b *backend, config string) pb.RateLimitServiceClient {
	c, _ := referenceServer(t, b, config)
	return c
}

// referenceServer is referenceService that also returns the base URL of its HTTP listener.
func referenceServer(t testing.TB, b *backend, config string) (pb.RateLimitServiceClient, string) {
	t.Helper()
	return referenceWithEnv(t, b, config)
}

// referenceWithEnv is referenceServer with more variables of its environment (which win).
func referenceWithEnv(t testing.TB, b *backend, config string, extra ...string) (pb.RateLimitServiceClient, string) {
	t.Helper()
	bin := reference.Bin(t)
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	redisType := "SINGLE"
	if b.name == "cluster" {
		redisType = "CLUSTER"
	}
	c, _, ports := startOnFreePorts(t, "the reference", 3, func(ports []int) (*exec.Cmd, string) {
		cmd := exec.Command(filepath.Join(bin, "service_cmd"))
		cmd.Env = append(os.Environ(),
			"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
			fmt.Sprint("PORT=", ports[0]), fmt.Sprint("GRPC_PORT=", ports[1]), fmt.Sprint("DEBUG_PORT=", ports[2]),
			"USE_STATSD=false", "LOG_LEVEL=error",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE="+redisType, "REDIS_URL="+strings.Join(b.addrs, ","),
			"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
			fmt.Sprintf("CACHE_KEY_PREFIX=ref%d:", time.Now().UnixNano()),
			"EXPIRATION_JITTER_MAX_SECONDS=0",
		)
		cmd.Env = append(cmd.Env, extra...)
		return cmd, fmt.Sprint("127.0.0.1:", ports[1])
	})
	return c, fmt.Sprint("http://127.0.0.1:", ports[0])
}

// startOnFreePorts starts the command build makes for n free ports, a rate limit service
// listening for gRPC on the address build returns, and returns a client of it once it
// answers, the command, and the ports (harness.RetryTakenPort: again on fresh ports when
// one was taken before the service bound it).
func startOnFreePorts(t testing.TB, what string, n int, build func(ports []int) (*exec.Cmd, string)) (pb.RateLimitServiceClient, *exec.Cmd, []int) {
	t.Helper()
	var c pb.RateLimitServiceClient
	var cmd *exec.Cmd
	var ports []int
	harness.RetryTakenPort(t, what, func() (bool, string) {
		ports = harness.FreePorts(t, n)
		var addr string
		cmd, addr = build(ports)
		var out string
		c, out = startProcess(t, what, cmd, addr)
		return c != nil, out
	})
	return c, cmd, ports
}

// startProcess starts cmd, a rate limit service listening for gRPC on addr, stopped when the
// test ends, and returns a client of it once it answers; or nil and its output when it
// stops first.
func startProcess(t testing.TB, what string, cmd *exec.Cmd, addr string) (pb.RateLimitServiceClient, string) {
	t.Helper()
	out, exited := harness.StartProcess(t, cmd)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := pb.NewRateLimitServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.ShouldRateLimit(ctx, request("nowhere", desc("k", "v")))
		cancel()
		if err == nil {
			return c, ""
		}
		select {
		case <-exited:
			return nil, out.String()
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered: %v\n%s", what, err, out.Tail(4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// step is one request of a sequence, sent times times.
type step struct {
	req   *pb.RateLimitRequest
	times int
}

// compare sends every step to both services and compares their responses field by field:
// duration_until_reset may differ by a second (two clocks read a few milliseconds apart, the
// reference's in whole seconds).
func compare(t *testing.T, ref pb.RateLimitServiceClient, ours *rig, steps []step) {
	t.Helper()
	awayFromMinuteEnd()
	n := 0
	for _, s := range steps {
		for range max(1, s.times) {
			n++
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			want, err := ref.ShouldRateLimit(ctx, s.req)
			cancel()
			if err != nil {
				t.Fatalf("reference, request %d %v: %v", n, s.req, err)
			}
			got := ours.ask(t, s.req)
			if diff := responseDiff(want, got); diff != "" {
				t.Fatalf("request %d %v:\n%s\nreference: %v\nrlfn:      %v", n, s.req, diff, want, got)
			}
		}
	}
}

// awayFromMinuteEnd waits out the last seconds of a minute, so that a sequence of minute
// windows (a second or two under load) runs in one window, on both services.
func awayFromMinuteEnd() {
	if s := time.Now().Second(); s >= 57 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
}

func responseDiff(want, got *pb.RateLimitResponse) string {
	var d []string
	if want.OverallCode != got.OverallCode {
		d = append(d, fmt.Sprintf("overall_code %v, reference %v", got.OverallCode, want.OverallCode))
	}
	if len(want.Statuses) != len(got.Statuses) {
		return fmt.Sprintf("%d statuses, reference %d", len(got.Statuses), len(want.Statuses))
	}
	for i, w := range want.Statuses {
		g := got.Statuses[i]
		if w.Code != g.Code {
			d = append(d, fmt.Sprintf("statuses[%d].code %v, reference %v", i, g.Code, w.Code))
		}
		if !proto.Equal(w.CurrentLimit, g.CurrentLimit) {
			d = append(d, fmt.Sprintf("statuses[%d].current_limit %v, reference %v", i, g.CurrentLimit, w.CurrentLimit))
		}
		if w.LimitRemaining != g.LimitRemaining {
			d = append(d, fmt.Sprintf("statuses[%d].limit_remaining %d, reference %d", i, g.LimitRemaining, w.LimitRemaining))
		}
		if (w.DurationUntilReset == nil) != (g.DurationUntilReset == nil) {
			d = append(d, fmt.Sprintf("statuses[%d].duration_until_reset %v, reference %v", i, g.DurationUntilReset, w.DurationUntilReset))
		} else if w.DurationUntilReset != nil {
			if diff := w.DurationUntilReset.Seconds - g.DurationUntilReset.Seconds; diff < -1 || diff > 1 || w.DurationUntilReset.Nanos != g.DurationUntilReset.Nanos {
				d = append(d, fmt.Sprintf("statuses[%d].duration_until_reset %v, reference %v", i, g.DurationUntilReset, w.DurationUntilReset))
			}
		}
	}
	return strings.Join(d, "\n")
}

// override gives a descriptor Envoy's own limit.
func override(d *rlv3.RateLimitDescriptor, n uint32, unit pb.RateLimitResponse_RateLimit_Unit) *rlv3.RateLimitDescriptor {
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit(unit)}
	return d
}

func readReference(t *testing.T, name string) string {
	return string(reference.ReadConfig(t, name))
}

// compareConfig is ours, with every feature whose answers are the reference's: nested
// descriptors, a key alone, trailing wildcards, unlimited, names and replaces, shadow mode,
// epoch-aligned windows of every unit.
const compareConfig = `
domain: cmp
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    value: vip
    rate_limit: {unit: day, requests_per_unit: 8}
  - key: org
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: week, requests_per_unit: 3}
      - key: path
        value: /admin*
        rate_limit: {unit: month, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: plan
    rate_limit: {name: basic, unit: year, requests_per_unit: 2}
  - key: upgrade
    rate_limit:
      unit: hour
      requests_per_unit: 4
      replaces: [{name: basic}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: open
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
`

func TestReferenceSideBySide(t *testing.T) {
	reference.Bin(t)
	forEachBackend(t, func(t *testing.T, b *backend) {
		t.Run("ours", func(t *testing.T) {
			ref := referenceService(t, b, compareConfig)
			ours := newRig(t, b, compareConfig, client.Options{}, rls.ServerOptions{}, rls.Options{})
			hits5 := request("cmp", desc("user", "bulk"))
			hits5.HitsAddend = 2
			compare(t, ref, ours, []step{
				{request("cmp", desc("user", "u1")), 7},
				{request("cmp", desc("user", "vip")), 9},
				{request("cmp", desc("org", "acme", "user", "u1")), 4},
				{request("cmp", desc("org", "acme", "path", "/admin/x")), 2},
				{request("cmp", desc("org", "acme", "path", "/public")), 1},
				{request("cmp", desc("org", "acme")), 1},
				{request("cmp", desc("org", "other", "user", "u1")), 1},
				{request("cmp", desc("free", "x")), 2},
				{request("cmp", desc("plan", "p", "x", "y")), 1},
				{request("cmp", desc("plan", "p"), desc("upgrade", "p")), 3},
				{request("cmp", desc("plan", "p")), 3},
				{request("cmp", desc("shadow", "s")), 3},
				{request("cmp", desc("open", "o")), 1},
				{request("other", desc("user", "u1")), 1},
				{hits5, 3},
				{request("cmp", hits(desc("user", "zero"), 0)), 2},
				{request("cmp", hits(desc("user", "three"), 3), desc("user", "u2")), 1},
				// A limit of 0: every hit is over it, a request of 0 hits is not.
				{request("cmp", hits(desc("closed", "c"), 0)), 1},
				{request("cmp", desc("closed", "c")), 2},
				// More hits than the limit, on a fresh key and on a used one.
				{request("cmp", hits(desc("user", "huge"), 9)), 1},
				{request("cmp", hits(desc("user", "u1"), 9)), 1},
				// Envoy's own limit for a descriptor (a limit override).
				{request("cmp", override(desc("user", "ov"), 3, pb.RateLimitResponse_RateLimit_HOUR)), 4},
				{request("cmp", override(desc("nothing", "ov"), 2, pb.RateLimitResponse_RateLimit_MINUTE)), 3},
				// On a domain no configuration has, the override is ignored with the rest.
				{request("other", override(desc("user", "ov"), 10, pb.RateLimitResponse_RateLimit_DAY)), 2},
				// An override of 0, as a configuration's limit of 0 (0 hits first: the
				// reference counts the refused ones).
				{request("cmp", override(hits(desc("user", "ov0"), 0), 0, pb.RateLimitResponse_RateLimit_MINUTE)), 1},
				{request("cmp", override(desc("user", "ov0"), 0, pb.RateLimitResponse_RateLimit_MINUTE)), 2},
				// Several descriptors, all admitted: as the reference.
				{request("cmp", desc("user", "a1"), desc("org", "acme", "user", "a1"), desc("free", "x")), 1},
			})
		})
		t.Run("basic_config", func(t *testing.T) {
			// The reference's own basic configuration, with its minute and longer limits.
			cfg := readReference(t, "basic_config.yaml")
			ref := referenceService(t, b, cfg)
			ours := newRig(t, b, cfg, client.Options{}, rls.ServerOptions{}, rls.Options{})
			compare(t, ref, ours, []step{
				{request("test-domain", desc("key2", "x")), 22},
				{request("test-domain", desc("key2", "value2")), 31},
				{request("test-domain", desc("key2", "value3")), 2},
				{request("test-domain", desc("key3", "a")), 2},
				{request("test-domain", desc("key4", "a")), 2},
				{request("test-domain", desc("key5", "value5")), 16},
				{request("test-domain", desc("key5", "value5", "subkey5", "subvalue5")), 26},
				{request("test-domain", desc("key6", "a")), 2},
				{request("test-domain", desc("key7", "a")), 2},
				{request("test-domain", desc("key1", "value1")), 1},
			})
		})
		if b.name != "valkey8" {
			return
		}
		for _, f := range []struct {
			name, file string
			steps      []step
		}{
			{"wildcard", "wildcard.yaml", []step{
				{request("test-domain", desc("wild", "foo1")), 21},
				{request("test-domain", desc("wild", "foo2")), 1},
				{request("test-domain", desc("noWild", "foo")), 1},
				{request("test-domain", desc("noWild", "foo1")), 1},
				{request("test-domain", desc("noVal", "x")), 1},
				{request("test-domain", desc("nestedWild", "val1", "wild", "goo1")), 21},
			}},
			{"shadowmode_config", "shadowmode_config.yaml", []step{
				{request("test-domain", desc("key2", "x")), 22},
				{request("test-domain", desc("key2", "value2")), 31},
			}},
			{"share_threshold", "share_threshold.yaml", []step{
				{request("test-domain", desc("files", "files/a")), 60},
				{request("test-domain", desc("files", "files/b")), 42},
				{request("test-domain", desc("file", "test1")), 1},
				{request("test-domain", desc("file", "test2")), 1},
				{request("test-domain", desc("user", "user/1", "resource", "res/1", "action", "get")), 2},
			}},
		} {
			t.Run(f.name, func(t *testing.T) {
				cfg := readReference(t, f.file)
				ours := newRig(t, b, cfg, client.Options{}, rls.ServerOptions{}, rls.Options{})
				compare(t, referenceService(t, b, cfg), ours, f.steps)
			})
		}
	})
}

// Where rlfn differs on purpose: a refused request takes nothing from any descriptor, where
// the reference counts it against every one.
func TestReferenceDifferences(t *testing.T) {
	b := backends(t)[0]
	cfg := `
domain: d
descriptors:
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	ref := referenceService(t, b, cfg)
	ours := newRig(t, b, cfg, client.Options{}, rls.ServerOptions{}, rls.Options{})
	both := request("d", desc("big", "x"), desc("small", "x"))
	compare(t, ref, ours, []step{{both, 1}})
	// Refused by small: the reference counts it against big, rlfn does not.
	want, err := ref.ShouldRateLimit(context.Background(), both)
	if err != nil {
		t.Fatal(err)
	}
	got := ours.ask(t, both)
	if want.OverallCode != pb.RateLimitResponse_OVER_LIMIT || got.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("reference %v, rlfn %v", want, got)
	}
	if want.Statuses[0].LimitRemaining != 3 || got.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("big: reference remaining %d (counted), rlfn %d (not counted); want 3 and 4", want.Statuses[0].LimitRemaining, got.Statuses[0].LimitRemaining)
	}
	// hits_addend 0 on a limit a refusal went past: the reference's count is over the limit,
	// rlfn's is at it.
	zero := request("d", hits(desc("small", "x"), 0))
	want, _ = ref.ShouldRateLimit(context.Background(), zero)
	got = ours.ask(t, zero)
	if want.OverallCode != pb.RateLimitResponse_OVER_LIMIT || got.OverallCode != pb.RateLimitResponse_OK || got.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("hits 0: reference %v, rlfn %v", want, got)
	}
	// One descriptor twice: both take, as the reference's; each status says what both left,
	// where the reference's first says what the first left.
	twice := request("d", desc("big", "y"), desc("big", "y"))
	want, err = ref.ShouldRateLimit(context.Background(), twice)
	if err != nil {
		t.Fatal(err)
	}
	got = ours.ask(t, twice)
	if want.OverallCode != got.OverallCode || want.Statuses[0].LimitRemaining != 4 || want.Statuses[1].LimitRemaining != 3 ||
		got.Statuses[0].LimitRemaining != 3 || got.Statuses[1].LimitRemaining != 3 {
		t.Fatalf("twice: reference %v, rlfn %v", want, got)
	}
	// A descriptor's hits_addend past what a count can hold: the reference takes 2^64-1 for
	// -1 (its Redis client's error, or an admission), rlfn refuses the request as invalid.
	huge := request("d", hits(desc("big", "z"), math.MaxUint64))
	want, err = ref.ShouldRateLimit(context.Background(), huge)
	if err == nil && want.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("huge hits: reference %v", want)
	}
	if _, err := ours.call(huge); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("huge hits: rlfn %v, want InvalidArgument", err)
	}
}

// Envoy AI Gateway's flow (a check of hits 0 on the request path, the response's tokens
// charged when the stream is done) under ChargeWhatFits answers as the reference, field by
// field, but where the budget is spent to the unit: the reference's count is then at its
// limit and admits a check, rlfn's refuses it, as it does a count the reference has taken
// past its limit (rlfn's never goes past).
func TestReferenceResponseCost(t *testing.T) {
	b := backends(t)[0]
	cfg := `
domain: llm
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
`
	ref := referenceService(t, b, cfg)
	ours := newRig(t, b, cfg, client.Options{}, rls.ServerOptions{}, rls.Options{ChargeWhatFits: true})
	check := request("llm", hits(desc("user", "a"), 0))
	done := func(tokens uint64) *pb.RateLimitRequest { return request("llm", hits(desc("user", "a"), tokens)) }
	compare(t, ref, ours, []step{
		{check, 1}, {done(40), 1}, {check, 1}, {done(50), 1}, {check, 1},
		// 30 tokens with 10 left: the reference counts 130, rlfn 100; both refuse the checks.
		{done(30), 1}, {check, 2}, {done(5), 1}, {check, 1},
	})
	// Spent to the unit: 100 of 100.
	exact := func(tokens uint64) *pb.RateLimitRequest { return request("llm", hits(desc("user", "b"), tokens)) }
	compare(t, ref, ours, []step{{exact(60), 1}, {exact(40), 1}})
	spent := request("llm", hits(desc("user", "b"), 0))
	want, err := ref.ShouldRateLimit(context.Background(), spent)
	if err != nil {
		t.Fatal(err)
	}
	got := ours.ask(t, spent)
	if want.OverallCode != pb.RateLimitResponse_OK || got.OverallCode != pb.RateLimitResponse_OVER_LIMIT || got.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("a check of a budget spent to the unit: reference %v, rlfn %v", want, got)
	}
}

// The HTTP/JSON endpoint answers as the reference's /json: the same status codes, the same
// responses.
func TestReferenceJSON(t *testing.T) {
	b := backends(t)[0]
	_, refURL := referenceServer(t, b, compareConfig)
	ours := newRig(t, b, compareConfig, client.Options{}, rls.ServerOptions{}, rls.Options{})
	post := func(base, body string) (int, *pb.RateLimitResponse) {
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var out pb.RateLimitResponse
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests {
			if err := protojson.Unmarshal(data, &out); err != nil {
				t.Fatalf("%s: %d %s: %v", base, resp.StatusCode, data, err)
			}
		}
		return resp.StatusCode, &out
	}
	for i, body := range []string{
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}]}`,
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}], "hitsAddend": 3}`,
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}]}`,
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}]}`,
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "free", "value": "json"}]}]}`,
		`{"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}]}`,
		`{"domain": "cmp"}`,
		`{"domain": 7}`,
		`not json`,
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}], "bogus": 1}`,
		`{"domain": "cmp", "descriptors": [{"entries": [{"key": "user", "value": "json"}]}], "hitsAddend": 4294967296}`,
		``,
	} {
		wantCode, want := post(refURL, body)
		gotCode, got := post(ours.http, body)
		if wantCode != gotCode {
			t.Fatalf("request %d %s: HTTP %d, reference %d", i, body, gotCode, wantCode)
		}
		if diff := responseDiff(want, got); diff != "" {
			t.Fatalf("request %d %s:\n%s", i, body, diff)
		}
	}
}
