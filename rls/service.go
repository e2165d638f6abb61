// Package rls is an Envoy rate limit service (envoy.service.ratelimit.v3, ShouldRateLimit)
// that decides with rlfn's library through the Go client. Its configuration is
// envoyproxy/ratelimit's YAML, with rlfn's extensions (see internal/envoyconf and
// docs/envoy.md).
//
// A Service is the decisions, with no network of its own: Server puts it behind gRPC and
// HTTP/JSON, Watch reloads its configuration.
package rls

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf"
)

// Headers chooses the rate limit headers a response asks Envoy to add.
type Headers uint8

const (
	NoHeaders Headers = iota // the default: none, as the reference without LIMIT_RESPONSE_HEADERS_ENABLED
	// ReferenceHeaders are envoyproxy/ratelimit's, under its default names (with
	// LIMIT_RESPONSE_HEADERS_ENABLED): RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset, of the descriptor closest to its limit, a refusing one first.
	ReferenceHeaders
	// DraftHeaders are the IETF draft's RateLimit and RateLimit-Policy (draft 11), one item per
	// limited descriptor.
	DraftHeaders
)

// Policy is how one domain's decisions meet a slow or failed backend (see NewLimiters).
type Policy struct {
	// Deadline bounds each call to the server (client.Options.Deadline). Default (0): the
	// base options' deadline.
	Deadline time.Duration
	// Fallback is what a call the server cannot decide returns, when HasFallback is set;
	// otherwise the base options' (rlfn-rls: client.ReturnError, so that a backend failure
	// reaches Envoy as a gRPC error and Envoy's failure_mode_deny decides, never a silent OK).
	Fallback    client.Fallback
	HasFallback bool
}

// LimiterFor returns the Limiter deciding a domain's requests: one per Policy, so that a
// domain's deadline and fallback are its own.
type LimiterFor func(domain string) *client.Limiter

// Service answers ShouldRateLimit. It is safe for concurrent use; SetConfig swaps the
// configuration between requests, and a request keeps the configuration it started with.
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	limiter LimiterFor
	config  atomic.Pointer[envoyconf.Config]
	headers Headers
	shadow  bool
	// dynamicMetadata: see Options.DynamicMetadata.
	dynamicMetadata bool
	metrics         *Metrics
	now             func() time.Time
	prefix          string
	fill            bool // Options.ChargeWhatFits
	bounds          *bounds
	undone          *throttledLog // the refunds of undo that failed
}

// Options configure a Service.
type Options struct {
	Headers Headers
	// ShadowMode answers every request OK overall (the reference's global SHADOW_MODE): the
	// statuses still say which descriptors are over their limits, and a request they refuse
	// still takes nothing.
	ShadowMode bool
	// DynamicMetadata adds the response's dynamic metadata as the reference does with
	// RESPONSE_DYNAMIC_METADATA (the request's domain, descriptors and hits, and the
	// configuration's metadata of the descriptors within their limits).
	DynamicMetadata bool
	// Metrics records what the service decides; nil records nothing.
	Metrics *Metrics
	// Now is the clock the fixed window's time until reset is read from when the server has
	// counted nothing yet (a cost of 0 on an empty window). Default: time.Now.
	Now func() time.Time
	// KeyPrefix starts every principal rlfn keys a descriptor by, before the domain.
	// Default "": the client's own prefix is enough to keep the service's keys apart.
	KeyPrefix string
	// MaxDescriptors, MaxEntries and MaxValueBytes bound one request's work: its descriptors,
	// each descriptor's entries, and the bytes of each entry's key and value (and of the
	// domain). A request past one is refused with INVALID_ARGUMENT naming it, before anything
	// is matched or sent to the server, so that one request cannot take the backend's time
	// (and, through its deadlines, its circuit breaker) from every other caller. Defaults (0):
	// DefaultMaxDescriptors, DefaultMaxEntries, DefaultMaxValueBytes. The client's
	// Options.MaxRules must allow RulesFor(MaxDescriptors).
	MaxDescriptors, MaxEntries, MaxValueBytes int
	// ChargeWhatFits decides each limit of a request's enforced descriptors on its own, and
	// charges it as much of its hits as it has room for, instead of all or nothing: a
	// descriptor whose hits did not all fit is OVER_LIMIT, and keeps what it was charged. A
	// descriptor with hits 0 is refused once its limit has nothing left (without it, hits 0
	// on a spent limit is OK). This is the accounting of a cost known only after the request
	// (Envoy AI Gateway's response cost, apply_on_stream_done): the tokens of a response
	// larger than what is left spend the budget, so the next check is refused, as the
	// reference's count past its limit refuses it, where all or nothing would charge them
	// nothing. A limit never counts past its limit. Quota-mode and shadow-mode descriptors,
	// and a request with a concurrency limit among its descriptors (a lease is all or
	// nothing), are decided as without it.
	ChargeWhatFits bool
	// Log receives a line, at warn and at most once per 10 seconds of each kind (with the
	// count of those not said), when requests are refused for their size, and when the refunds
	// of a request refused after its limits admitted (quota mode, a lease refused) fail.
	// Default (nil): none.
	Log *slog.Logger
}

// NewService returns a Service deciding with limiter's Limiters, starting with cfg.
func NewService(limiter LimiterFor, cfg *envoyconf.Config, o Options) *Service {
	s := &Service{limiter: limiter, headers: o.Headers, shadow: o.ShadowMode, dynamicMetadata: o.DynamicMetadata, metrics: o.Metrics, now: o.Now, prefix: o.KeyPrefix, fill: o.ChargeWhatFits}
	if s.now == nil {
		s.now = time.Now
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s.bounds = &bounds{descriptors: or(o.MaxDescriptors, DefaultMaxDescriptors), entries: or(o.MaxEntries, DefaultMaxEntries),
		valueBytes: or(o.MaxValueBytes, DefaultMaxValueBytes), refusals: throttledLog{log: log}}
	s.undone = &throttledLog{log: log}
	s.config.Store(cfg)
	return s
}

func or(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// SetConfig replaces the configuration: requests that start after it use cfg.
func (s *Service) SetConfig(cfg *envoyconf.Config) { s.config.Store(cfg) }

// Config is the configuration in use.
func (s *Service) Config() *envoyconf.Config { return s.config.Load() }

// ShouldRateLimit decides every descriptor of req, all or nothing: either every limited
// descriptor admits and each takes its hits, or none takes anything.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	cfg := s.Config()
	resp, ds, err := s.shouldRateLimit(ctx, cfg, req)
	s.metrics.request(ctx, cfg, req.GetDomain(), resp, ds, err, time.Since(start))
	return resp, err
}

// descriptor is one descriptor of a request, as the configuration limits it.
type descriptor struct {
	rl       *envoyconf.RateLimit // nil: no limit
	key      string               // the principal
	holder   string               // a concurrency limit's holder, from the HolderKey entry
	hits     int64
	negative bool // is_negative_hits: a refund, or a lease's release
	status   *pb.RateLimitResponse_DescriptorStatus
	// took: the rules this descriptor's decision took units of (a rule of several descriptors
	// is its first one's), and what each answered, for a refund when the request is refused
	// after all (quota mode, a lease denied).
	took   []took
	leases []*client.Lease
	// granted: what each lease of leases answered, for the status of an admitted request.
	granted []client.Result
	// shadowed: a shadow_mode descriptor that would have refused.
	shadowed bool
}

func (s *Service) shouldRateLimit(ctx context.Context, cfg *envoyconf.Config, req *pb.RateLimitRequest) (*pb.RateLimitResponse, []*descriptor, error) {
	// The reference's messages for a request it cannot decide.
	if req.GetDomain() == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if err := s.bounds.check(ctx, req); err != nil {
		return nil, nil, err
	}
	if cfg == nil {
		return nil, nil, status.Error(codes.Unavailable, "no rate limit configuration loaded")
	}
	lim := s.limiter(req.Domain)
	ds := make([]*descriptor, len(req.Descriptors))
	replacing := map[string]bool{}
	for i, d := range req.Descriptors {
		desc, err := s.plan(cfg, req, d)
		if err != nil {
			return nil, nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		ds[i] = desc
		if desc.rl != nil {
			for _, r := range desc.rl.Replaces {
				replacing[r] = true
			}
		}
	}
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(ds))}
	var enforced, quota, shadow []*descriptor
	for _, d := range ds {
		if d.rl != nil && d.rl.Name != "" && replacing[d.rl.Name] && !d.rl.Unlimited {
			// Another descriptor of the request replaces this one's limit.
			d.rl = nil
		}
		switch {
		case d.rl == nil:
			d.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		case d.rl.Unlimited:
			d.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case d.negative:
			if err := s.giveBack(ctx, lim, d); err != nil {
				return nil, nil, backendError(err)
			}
		case d.rl.ShadowMode:
			shadow = append(shadow, d)
		case d.rl.QuotaMode:
			quota = append(quota, d)
		default:
			enforced = append(enforced, d)
		}
	}
	admitted, err := s.decide(ctx, lim, enforced, false, s.fill)
	if err != nil {
		return nil, nil, backendError(err)
	}
	if admitted && len(quota) > 0 {
		// The reference refuses a request on quota descriptors only when all of them are
		// over: each is decided alone, and the request stands if any admits.
		some := false
		for _, d := range quota {
			ok, err := s.decide(ctx, lim, []*descriptor{d}, false, false)
			if err != nil {
				s.undo(lim, append(enforced, quota...))
				return nil, nil, backendError(err)
			}
			some = some || ok
		}
		if !some {
			admitted = false
			s.undo(lim, enforced)
		}
	} else if len(quota) > 0 {
		if _, err := s.decide(ctx, lim, quota, true, false); err != nil {
			return nil, nil, backendError(err)
		}
	}
	for _, d := range shadow {
		// A shadow descriptor never refuses: it takes its hits when the request is admitted,
		// and is only looked at when it is not (a refused request takes nothing).
		if _, err := s.decide(ctx, lim, []*descriptor{d}, !admitted, false); err != nil {
			if admitted {
				s.undo(lim, append(enforced, quota...))
			}
			return nil, nil, backendError(err)
		}
		if d.status.Code == pb.RateLimitResponse_OVER_LIMIT {
			d.shadowed = true
			d.status.Code = pb.RateLimitResponse_OK
		}
	}
	if !admitted && !s.shadow {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	}
	for i, d := range ds {
		resp.Statuses[i] = d.status
	}
	s.addHeaders(resp, ds)
	if s.dynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, ds)
	}
	return resp, ds, nil
}

// plan matches one descriptor of the request.
func (s *Service) plan(cfg *envoyconf.Config, req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor) (*descriptor, error) {
	hits := max(1, uint64(req.HitsAddend))
	if d.GetHitsAddend() != nil {
		// A descriptor's own hits_addend may be 0: it decides without taking.
		hits = d.GetHitsAddend().GetValue()
	}
	if hits > maxHits {
		return nil, fmt.Errorf("hits_addend %d is more than %d", hits, maxHits)
	}
	desc := &descriptor{hits: int64(hits), negative: d.GetIsNegativeHits()}
	entries := make([]envoyconf.Entry, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		entries[i] = envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	var shared []string
	if o := d.GetLimit(); o != nil && cfg.HasDomain(req.Domain) {
		// Envoy's per-descriptor override: a fixed window, as the reference reads it. On a
		// domain no configuration has, the reference ignores it with the whole request (OK,
		// no limit): so does rlfn.
		rl, err := envoyconf.Override(req.Domain, entries, o.GetRequestsPerUnit(), envoyconf.Unit(o.GetUnit()), int64(o.GetUnitMultiplier().GetValue()))
		if err != nil {
			return nil, err
		}
		desc.rl = rl
	} else {
		m := cfg.Match(req.Domain, entries)
		desc.rl, shared = m.Limit, m.Shared
	}
	if desc.rl == nil || desc.rl.Unlimited {
		return desc, nil
	}
	holderKey := ""
	for _, l := range desc.rl.Limits {
		if l.Slots != nil {
			holderKey = l.HolderKey
		}
	}
	var b strings.Builder
	b.WriteString(s.prefix)
	b.WriteString(escape(req.Domain))
	for i, e := range entries {
		if holderKey != "" && e.Key == holderKey {
			desc.holder = e.Value
			continue
		}
		v := e.Value
		if i < len(shared) && shared[i] != "" {
			v = shared[i]
		}
		b.WriteByte('/')
		b.WriteString(escape(e.Key))
		b.WriteByte('=')
		b.WriteString(escape(v))
	}
	desc.key = b.String()
	if len(desc.key) > maxKey {
		// A principal as long as the request's values would cost the server that much per
		// limiter: a long one is keyed by its hash.
		sum := sha256.Sum256([]byte(desc.key))
		desc.key = s.prefix + "sha256:" + hex.EncodeToString(sum[:])
	}
	if holderKey != "" && desc.holder == "" {
		return nil, fmt.Errorf("the concurrency limit of %s needs the entry %q naming the lease's holder", desc.rl.FullKey, holderKey)
	}
	return desc, nil
}

// maxKey is the longest principal kept as it is, below the client's 512 bytes.
const maxKey = 256

// maxHits is the most units the library takes in one call.
const maxHits = 999999999999999

var escaper = strings.NewReplacer("%", "%25", "/", "%2F", "=", "%3D")

// escape keeps the principal's composition unambiguous: no domain, key or value can end
// another's part early.
func escape(s string) string { return escaper.Replace(s) }

// decide runs one all-or-nothing decision over ds's limits (peek: without taking; fill:
// each limit charged what fits, Options.ChargeWhatFits), and sets each descriptor's status.
// It reports whether every limit admitted.
func (s *Service) decide(ctx context.Context, lim *client.Limiter, ds []*descriptor, peek, fill bool) (bool, error) {
	var rules []client.Rule
	var owners [][]int // the descriptors of each rule
	var limits []envoyconf.Limit
	type ruleID struct {
		key   string
		limit *envoyconf.Limit // the configuration's, so one limit of it is one ID
	}
	index := map[ruleID]int{}
	for i, d := range ds {
		for k := range d.rl.Limits {
			l := d.rl.Limits[k]
			if l.Client == nil {
				continue
			}
			// Envoy sends one descriptor twice when two of a route's actions make the same:
			// one limiter cannot be two rules of a decision, so it takes their hits added
			// up, and both report what the sum left.
			id := ruleID{d.key, &d.rl.Limits[k]}
			if j, ok := index[id]; ok {
				rules[j].Cost += d.hits
				owners[j] = append(owners[j], i)
				continue
			}
			index[id] = len(rules)
			// Zero is the call's n, which is 0 below: a descriptor's hits of 0 take nothing
			// while the others take theirs.
			rules = append(rules, client.Rule{Key: d.key, Limit: l.Client, Cost: d.hits})
			owners = append(owners, []int{i})
			limits = append(limits, l)
		}
	}
	each := make([]client.Result, len(rules))
	admitted := true
	for _, d := range ds {
		for _, l := range d.rl.Limits {
			if l.Slots != nil {
				// A lease is all or nothing: so is the decision it is part of.
				fill = false
			}
		}
	}
	for _, d := range ds {
		for _, l := range d.rl.Limits {
			if l.Zero && (d.hits > 0 || fill) {
				// A limit of 0 refuses every hit, with no call (and, with fill, a check of
				// hits 0: it has nothing left): the others are then only looked at
				// (charged what fits, with fill).
				admitted = false
			}
		}
	}
	if !admitted && !fill {
		peek = true
	}
	if len(rules) > 0 {
		if fill && !peek {
			// A failure midway keeps what was charged before it: a cost known after the
			// response was spent (the request's error reaches Envoy, which ignores a
			// stream-done call's answer), and a refund could fail the same way.
			taken, all, err := fillRules(ctx, lim, rules, each)
			for j, r := range rules {
				if taken[j] > 0 {
					r.Cost = taken[j]
					d := ds[owners[j][0]]
					d.took = append(d.took, took{r, each[j]})
				}
			}
			if err != nil {
				return false, err
			}
			admitted = admitted && all
		} else if peek {
			// A refused request looks at the other descriptors without taking: one peek
			// each, for their own status.
			for i, r := range rules {
				res, err := lim.PeekN(ctx, r.Key, r.Limit, r.Cost)
				if err != nil {
					return false, err
				}
				each[i] = res
			}
		} else {
			res, e, err := lim.AllowAllEach(ctx, rules, 0)
			if err != nil {
				return false, err
			}
			admitted = res.Allowed
			copy(each, e)
			if admitted {
				for j, r := range rules {
					d := ds[owners[j][0]]
					d.took = append(d.took, took{r, e[j]})
				}
			}
		}
	}
	// Concurrency leases are no part of rl_multi: taken after the limits admitted, and
	// given back with them when one is refused.
	var refusedLease *descriptor
	var leaseRes client.Result
	if admitted && !peek {
	leases:
		for _, d := range ds {
			for _, l := range d.rl.Limits {
				if l.Slots == nil {
					continue
				}
				le, err := lim.Lease(d.key, *l.Slots, d.holder)
				if err != nil {
					s.undo(lim, ds)
					return false, err
				}
				res, err := le.Renew(ctx)
				if err != nil {
					s.undo(lim, ds)
					return false, err
				}
				if !res.Allowed {
					refusedLease, leaseRes, admitted = d, res, false
					break leases
				}
				d.leases = append(d.leases, le)
				d.granted = append(d.granted, res)
			}
		}
		if !admitted {
			s.undo(lim, ds)
		}
	}
	for i, d := range ds {
		var mine []client.Result
		var theirs []envoyconf.Limit
		for j, r := range each {
			if slices.Contains(owners[j], i) {
				mine = append(mine, r)
				theirs = append(theirs, limits[j])
			}
		}
		if d == refusedLease {
			mine = append(mine, leaseRes)
			theirs = append(theirs, slotsOf(d.rl))
		} else if admitted {
			// A lease granted is a limit of the status as one refused is: its current_limit
			// and what is left, not an OK that looks like no limit matched.
			for _, r := range d.granted {
				mine = append(mine, r)
				theirs = append(theirs, slotsOf(d.rl))
			}
		}
		for _, l := range d.rl.Limits {
			if l.Zero {
				// Over it with any hit; the time until reset is the window's end.
				mine = append(mine, client.Result{Allowed: d.hits == 0 && !fill})
				theirs = append(theirs, l)
			}
		}
		d.status = s.status(d.rl, theirs, mine)
	}
	return admitted, nil
}

// fillRules decides each rule on its own and charges it as much of its Cost as it has room
// for (Options.ChargeWhatFits), setting each's result: refused unless the whole Cost was
// charged. A rule of Cost 0 is a check, refused once nothing is left (a peek of 1 unit).
// The rules that fit are charged by one all-or-nothing call, the common case; when it
// refuses, each rule with a Cost is asked again for what its reply left, up to 3 times (the
// others take units between the calls). It returns what each rule was charged, and whether
// every rule had its whole Cost.
func fillRules(ctx context.Context, lim *client.Limiter, rules []client.Rule, each []client.Result) ([]int64, bool, error) {
	taken := make([]int64, len(rules))
	var costly []client.Rule
	var at []int // the index in rules of each of costly
	all := true
	for j, r := range rules {
		if r.Cost > 0 {
			costly, at = append(costly, r), append(at, j)
			continue
		}
		res, err := lim.PeekN(ctx, r.Key, r.Limit, 1)
		if err != nil {
			return taken, false, err
		}
		each[j] = res // a peek's remaining is what is left, its unit not taken
		all = all && res.Allowed
	}
	if len(costly) == 0 {
		return taken, all, nil
	}
	res, e, err := lim.AllowAllEach(ctx, costly, 0)
	if err != nil {
		return taken, false, err
	}
	for k, j := range at {
		each[j] = e[k]
		if res.Allowed {
			taken[j] = rules[j].Cost
		}
	}
	if res.Allowed {
		return taken, all, nil
	}
	for _, j := range at {
		r := rules[j]
		for try := 0; try < 3; try++ {
			want := min(r.Cost, each[j].Remaining)
			if want <= 0 {
				break
			}
			got, err := lim.AllowN(ctx, r.Key, r.Limit, want)
			if err != nil {
				return taken, false, err
			}
			each[j] = got
			if got.Allowed {
				taken[j] = want
				break
			}
		}
		if taken[j] < r.Cost {
			all = false
			if each[j].Allowed {
				// Charged part of its hits: the rest is refused, until the limit has room
				// again (its reset bounds that wait).
				each[j].Allowed, each[j].RetryAfter = false, each[j].ResetAfter
			}
		}
	}
	return taken, all, nil
}

func slotsOf(rl *envoyconf.RateLimit) envoyconf.Limit {
	for _, c := range rl.Limits {
		if c.Slots != nil {
			return c
		}
	}
	return envoyconf.Limit{}
}

// took is a rule a decision admitted, and what it answered.
type took struct {
	rule client.Rule
	res  client.Result
}

// undo gives back what ds's decisions took, for a request refused after they admitted. The
// refunds are the Limiter's (RefundAll): owed whatever becomes of the request, tried again in
// the background when the server cannot make them now, and counted when given up; the leases'
// releases run on their own deadline.
func (s *Service) undo(lim *client.Limiter, ds []*descriptor) {
	var rules []client.Rule
	var each []client.Result
	for _, d := range ds {
		for _, t := range d.took {
			rules = append(rules, t.rule)
			each = append(each, t.res)
		}
		d.took = nil
	}
	if len(rules) > 0 {
		if err := lim.RefundAll(context.Background(), rules, 0, each); err != nil {
			// The rules were decided as they are: a refusal of them now is a defect.
			s.undone.say(context.Background(), fmt.Sprintf("the refunds of a refused request were refused: %v", err))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	failed, all := 0, 0
	var first error
	for _, d := range ds {
		for _, le := range d.leases {
			_, err := le.Release(ctx)
			all++
			if err != nil {
				failed++
				first = cmp.Or(first, err)
			}
		}
		d.leases = nil
	}
	if failed > 0 {
		// Those slots stay taken until their leases expire.
		s.undone.say(ctx, fmt.Sprintf("%d of %d lease releases of a refused request failed: %v", failed, all, first))
	}
}

// giveBack answers a descriptor with is_negative_hits: its hits are refunded to each of its
// limits, and a concurrency limit's lease of its holder is released.
func (s *Service) giveBack(ctx context.Context, lim *client.Limiter, d *descriptor) error {
	var results []client.Result
	var limits []envoyconf.Limit
	for _, l := range d.rl.Limits {
		var res client.Result
		var err error
		if l.Slots != nil {
			var le *client.Lease
			if le, err = lim.Lease(d.key, *l.Slots, d.holder); err == nil {
				res, err = le.Release(ctx)
			}
			res.Allowed = true
		} else {
			res, err = lim.Refund(ctx, d.key, l.Client, d.hits)
		}
		if err != nil {
			return err
		}
		results = append(results, res)
		limits = append(limits, l)
	}
	d.status = s.status(d.rl, limits, results)
	return nil
}

// status is a descriptor's status from its limits' results: the binding one is the
// refusing limit with the longest wait, else the one with the fewest units left.
func (s *Service) status(rl *envoyconf.RateLimit, limits []envoyconf.Limit, results []client.Result) *pb.RateLimitResponse_DescriptorStatus {
	if len(results) == 0 {
		return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	}
	b := 0
	for i, r := range results {
		cur := results[b]
		switch {
		case !r.Allowed && cur.Allowed, !r.Allowed && !cur.Allowed && r.RetryAfter > cur.RetryAfter,
			r.Allowed && cur.Allowed && r.Remaining < cur.Remaining:
			b = i
		}
	}
	r, l := results[b], limits[b]
	st := &pb.RateLimitResponse_DescriptorStatus{
		Code:         pb.RateLimitResponse_OK,
		CurrentLimit: &pb.RateLimitResponse_RateLimit{Name: rl.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(l.Unit)},
	}
	if l.Multiplier > 1 {
		st.CurrentLimit.UnitMultiplier = wrapU32(l.Multiplier)
	}
	var reset time.Duration
	if r.Allowed {
		st.LimitRemaining = uint32(min(r.Remaining, math.MaxUint32))
		reset = r.ResetAfter
	} else {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
		// The reference counts the refused hits, so it has none left: so has rlfn's answer.
		st.LimitRemaining = 0
		reset = r.RetryAfter
		if reset == client.Never {
			// No wait admits these hits: say when the limit is whole again.
			reset = r.ResetAfter
		}
	}
	if reset == 0 && l.Algorithm == envoyconf.FixedWindow {
		// Nothing counted in the window (hits 0, or more hits than the limit on a fresh
		// key): the reference still says when the window ends.
		p := l.Period()
		reset = p - time.Duration(s.now().UnixNano())%p
	}
	if reset > 0 {
		st.DurationUntilReset = &durationpb.Duration{Seconds: int64((reset + time.Second - 1) / time.Second)}
	} else {
		st.DurationUntilReset = &durationpb.Duration{}
	}
	return st
}

// backendError is a failure of the backend as a gRPC error, so that Envoy's
// failure_mode_deny decides, never a silent OK.
func backendError(err error) error {
	var le *client.LimitError
	var ke *client.KeyError
	switch {
	case errors.As(err, &le), errors.As(err, &ke):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// addHeaders asks Envoy to add rate limit headers to the response, from the descriptors'
// statuses.
func (s *Service) addHeaders(resp *pb.RateLimitResponse, ds []*descriptor) {
	switch s.headers {
	case ReferenceHeaders:
		// The descriptor closest to its limit, a refusing one first, as the reference picks.
		var best *pb.RateLimitResponse_DescriptorStatus
		for _, d := range ds {
			st := d.status
			if st.CurrentLimit == nil {
				continue
			}
			if best == nil || (st.Code == pb.RateLimitResponse_OVER_LIMIT && best.Code != pb.RateLimitResponse_OVER_LIMIT) ||
				(st.Code == best.Code && st.LimitRemaining < best.LimitRemaining) {
				best = st
			}
		}
		if best == nil {
			return
		}
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: "RateLimit-Limit", Value: fmt.Sprint(best.CurrentLimit.RequestsPerUnit)},
			{Key: "RateLimit-Remaining", Value: fmt.Sprint(best.LimitRemaining)},
			{Key: "RateLimit-Reset", Value: fmt.Sprint(best.DurationUntilReset.GetSeconds())},
		}
	case DraftHeaders:
		var items, policies []string
		for i, d := range ds {
			st := d.status
			if st.CurrentLimit == nil {
				continue
			}
			name := fmt.Sprintf("d%d", i)
			window := envoyconf.Unit(st.CurrentLimit.Unit).Length()
			if m := st.CurrentLimit.GetUnitMultiplier(); m != nil {
				window *= time.Duration(m.GetValue())
			}
			items = append(items, fmt.Sprintf("%q;r=%d;t=%d", name, st.LimitRemaining, st.DurationUntilReset.GetSeconds()))
			policies = append(policies, fmt.Sprintf("%q;q=%d;w=%d", name, st.CurrentLimit.RequestsPerUnit, int64(window/time.Second)))
		}
		if len(items) == 0 {
			return
		}
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: "RateLimit", Value: strings.Join(items, ", ")},
			{Key: "RateLimit-Policy", Value: strings.Join(policies, ", ")},
		}
	}
}

func wrapU32(n int64) *wrapperspb.UInt32Value {
	return wrapperspb.UInt32(uint32(min(n, math.MaxUint32)))
}
