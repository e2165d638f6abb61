package rls

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The defaults of the bounds on one request's work (Options.MaxDescriptors, MaxEntries,
// MaxValueBytes). An Envoy route makes one descriptor per rate_limits action list and one
// entry per action: a handful of each. envoyproxy/ratelimit bounds neither, only gRPC's 4 MiB
// message, in which 100,000 descriptors fit, each a call to the backend.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 16
	DefaultMaxValueBytes  = 4096
)

// limitsPerDescriptor is the most limits a descriptor's rate_limits decide in one rl_multi.
const limitsPerDescriptor = 16

// RulesFor is the most rules one request's decision gives the client (client.Options.MaxRules)
// when requests have at most maxDescriptors descriptors.
func RulesFor(maxDescriptors int) int { return min(maxDescriptors*limitsPerDescriptor, 1_000_000) }

// bounds are a Service's bounds on one request, and its log of the requests they refuse.
type bounds struct {
	descriptors, entries, valueBytes int
	refusals                         throttledLog
	freeing                          atomic.Bool
}

// throttledLog writes one kind of line at most once per refusalsEvery, counting those it did
// not write in the next one's "suppressed".
type throttledLog struct {
	log        *slog.Logger
	mu         sync.Mutex
	said       time.Time // when a line was last written
	suppressed int       // lines not written since
}

func (t *throttledLog) say(ctx context.Context, msg string, attrs ...slog.Attr) {
	t.mu.Lock()
	now := time.Now()
	if !t.said.IsZero() && now.Sub(t.said) < refusalsEvery {
		t.suppressed++
		t.mu.Unlock()
		return
	}
	suppressed := t.suppressed
	t.said, t.suppressed = now, 0
	t.mu.Unlock()
	t.log.LogAttrs(ctx, slog.LevelWarn, msg, append(attrs, slog.Int("suppressed", suppressed))...)
}

// freeAfter is how long after a refusal the memory its request took is given back to the
// system: once a second at most, however many requests are refused meanwhile.
const freeAfter = time.Second

// free gives the memory of refused requests back to the system, freeAfter after the first
// refusal since it last did. gRPC decodes a request whole before the service sees it (one over
// ServerOptions.MaxRequestBytes it refuses undecoded): the 9,000 empty descriptors that fit in
// 64 KiB are a few MB of objects, 100,000 in 1 MiB about 40 MB, garbage once refused, but the
// heap's goal, set while they were live, keeps that memory in the process until the next
// collection, which an idle service may not run for minutes. One collection a second under a
// flood of such requests costs less than decoding one of them.
func (b *bounds) free() {
	if b.freeing.CompareAndSwap(false, true) {
		time.AfterFunc(freeAfter, func() {
			// First: a request refused while this runs has its own turn a second later.
			b.freeing.Store(false)
			// Two collections: sync.Pools (gRPC's buffers) keep their objects through one.
			runtime.GC()
			debug.FreeOSMemory()
		})
	}
}

// refusalsEvery is the least time between two lines about refused requests: a caller that
// sends nothing but oversized requests costs the log one line per period, not one per request.
const refusalsEvery = 10 * time.Second

// check refuses a request past a bound, before anything of it is matched or sent: an
// INVALID_ARGUMENT naming the bound (and rlfn-rls's flag that sets it), short whatever the
// request's size.
func (b *bounds) check(ctx context.Context, req *pb.RateLimitRequest) error {
	err := b.exceeded(req)
	if err != nil {
		b.logRefusal(ctx, req.GetDomain(), err)
		b.free()
	}
	return err
}

func (b *bounds) exceeded(req *pb.RateLimitRequest) error {
	if n := len(req.GetDescriptors()); n > b.descriptors {
		return status.Errorf(codes.InvalidArgument, "rate limit request has %d descriptors, more than %d (--max-descriptors)", n, b.descriptors)
	}
	if n := len(req.GetDomain()); n > b.valueBytes {
		return status.Errorf(codes.InvalidArgument, "rate limit domain of %d bytes, more than %d (--max-value-bytes)", n, b.valueBytes)
	}
	for i, d := range req.GetDescriptors() {
		if n := len(d.GetEntries()); n > b.entries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries, more than %d (--max-entries)", i, n, b.entries)
		}
		for j, e := range d.GetEntries() {
			if n := max(len(e.GetKey()), len(e.GetValue())); n > b.valueBytes {
				return status.Errorf(codes.InvalidArgument, "descriptor %d entry %d has a key or value of %d bytes, more than %d (--max-value-bytes)", i, j, n, b.valueBytes)
			}
		}
	}
	return nil
}

// logRefusal says, at most once per refusalsEvery, that a request was refused, and how many
// were since the last line.
func (b *bounds) logRefusal(ctx context.Context, domain string, err error) {
	if len(domain) > 64 {
		domain = fmt.Sprintf("%s... (%d bytes)", domain[:64], len(domain))
	}
	b.refusals.say(ctx, "request refused: larger than the service takes",
		slog.String("domain", domain), slog.String("err", status.Convert(err).Message()))
}
