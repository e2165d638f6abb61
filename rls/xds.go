package rls

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rlfn/rlfn/internal/envoyconf"
)

// XDS is the configuration source of Envoy Gateway and other control planes: a
// state-of-the-world xDS client of go-control-plane's RateLimitConfig resources, as the
// reference's CONFIG_TYPE=GRPC_XDS_SOTW. Each response is the whole configuration, loaded as
// a file reload is: the same checks, the same errors; a bad one is refused (NACKed to the
// server), logged and counted, and the last good one still applies.
type XDS struct {
	// Server is the management server's gRPC address (host:port).
	Server string
	// Node identifies this service to the server (the reference's CONFIG_GRPC_XDS_NODE_ID
	// and _NODE_METADATA): Envoy Gateway serves the node "envoy-ratelimit".
	Node *corev3.Node
	// DialOptions are the connection's (its credentials first).
	DialOptions []grpc.DialOption
	// Headers are sent with the stream (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// Merge lets several resources add to one domain (MERGE_DOMAIN_CONFIG).
	Merge bool
	// Backoff between reconnections, reset by each configuration received: from Initial,
	// each wait Factor times the one before (0: 2; 1 or less: every wait is Initial) up to Max, and
	// randomised by ±RandomFactor.
	Initial, Max time.Duration
	Factor       float64
	RandomFactor float64
}

// backOff is the waits between reconnections the fields describe.
func (x XDS) backOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.RandomizationFactor, b.Multiplier = x.Initial, x.Max, x.RandomFactor, x.Factor
	switch {
	case b.Multiplier == 0:
		b.Multiplier = 2
	case b.Multiplier < 1:
		// As the reference's back-off takes a factor below 1 (its default, 0.5): every wait
		// the initial one. Shrinking waits would reach 0 and call the server in a loop.
		b.Multiplier = 1
	}
	b.MaxElapsedTime = 0 // for ever
	b.Reset()
	return b
}

// Run receives configurations and applies them to svc until ctx is done, reconnecting after
// each failure of the connection or the stream. It returns nil once ctx is done.
func (x XDS) Run(ctx context.Context, svc *Service, m *Metrics, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := x.backOff()
	for {
		received, err := x.stream(ctx, svc, m, log)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			b.Reset()
		}
		wait := b.NextBackOff()
		msg := "the xDS configuration server is not reachable; the configuration in use still applies"
		if svc.Config() == nil {
			msg = "the xDS configuration server is not reachable; still waiting for the first configuration"
		}
		log.Warn(msg, "server", x.Server, "err", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// stream receives configurations over one connection until it fails, and says whether any
// came.
func (x XDS) stream(ctx context.Context, svc *Service, m *Metrics, log *slog.Logger) (received bool, err error) {
	conn, err := grpc.NewClient(x.Server, x.DialOptions...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, metadata.New(x.Headers)))
	defer cancel()
	c := sotw.NewADSClient(ctx, x.Node, resource.RateLimitConfigType)
	if err := c.InitConnect(conn); err != nil {
		return false, err
	}
	for {
		resp, err := c.Fetch()
		if err != nil {
			return received, err
		}
		received = true
		cfg, err := LoadXDS(resp.Resources, x.Merge)
		m.ConfigLoaded(err)
		if err != nil {
			log.Error("the configuration from xDS does not load; the previous one still applies", "err", err)
			if err := c.Nack(err.Error()); err != nil {
				return received, err
			}
			continue
		}
		svc.SetConfig(cfg)
		log.Info("configuration received over xDS", "domains", len(cfg.Domains()))
		if err := c.Ack(); err != nil {
			return received, err
		}
	}
}

// LoadXDS loads RateLimitConfig resources as the files they stand for: each one a file
// named xds:NAME, with the reference's YAML keys.
func LoadXDS(resources []*anypb.Any, merge bool) (*envoyconf.Config, error) {
	files := make([]envoyconf.File, 0, len(resources))
	for _, r := range resources {
		var c rlsconfv3.RateLimitConfig
		if err := r.UnmarshalTo(&c); err != nil {
			return nil, fmt.Errorf("xDS: a resource of type %s is not a RateLimitConfig: %w", r.GetTypeUrl(), err)
		}
		data, err := yaml.Marshal(map[string]any{"domain": c.Domain, "descriptors": xdsDescriptors(c.Descriptors)})
		if err != nil {
			return nil, err
		}
		files = append(files, envoyconf.File{Name: "xds:" + c.Name, Data: data})
	}
	return envoyconf.Load(files, merge)
}

// xdsDescriptors are ds as the reference's YAML writes them (its ConfigXdsProtoToYaml).
func xdsDescriptors(ds []*rlsconfv3.RateLimitDescriptor) []map[string]any {
	out := make([]map[string]any, 0, len(ds))
	for _, d := range ds {
		y := map[string]any{"key": d.Key}
		if d.Value != "" {
			y["value"] = d.Value
		}
		if p := d.RateLimit; p != nil {
			rl := map[string]any{}
			if p.Unit != rlsconfv3.RateLimitUnit_UNKNOWN {
				rl["unit"] = p.Unit.String()
			}
			if p.Unlimited {
				rl["unlimited"] = true
			} else {
				rl["requests_per_unit"] = p.RequestsPerUnit
			}
			if p.Name != "" {
				rl["name"] = p.Name
			}
			if len(p.Replaces) > 0 {
				var rs []map[string]any
				for _, r := range p.Replaces {
					rs = append(rs, map[string]any{"name": r.Name})
				}
				rl["replaces"] = rs
			}
			y["rate_limit"] = rl
		}
		if len(d.Descriptors) > 0 {
			y["descriptors"] = xdsDescriptors(d.Descriptors)
		}
		if d.ShadowMode {
			y["shadow_mode"] = true
		}
		if d.DetailedMetric {
			y["detailed_metric"] = true
		}
		if d.QuotaMode {
			y["quota_mode"] = true
		}
		if d.Metadata != nil {
			y["metadata"] = d.Metadata.AsMap()
		}
		out = append(out, y)
	}
	return out
}
