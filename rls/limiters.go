package rls

import (
	"context"
	"errors"
	"fmt"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
)

// Limiters are a service's Limiters over one valkey.Client: one with the base options, and
// one for each domain with a Policy of its own, so that a domain's deadline and fallback are
// its own while every domain shares the connections.
type Limiters struct {
	def      *client.Limiter
	byDomain map[string]*client.Limiter
}

// NewLimiters makes the Limiters: base for every domain, with Deadline and Fallback
// replaced by a domain's Policy where policies has one. A Policy without HasFallback keeps
// base's Fallback.
func NewLimiters(vk valkey.Client, base client.Options, policies map[string]Policy) (*Limiters, error) {
	def, err := client.New(vk, base)
	if err != nil {
		return nil, err
	}
	ls := &Limiters{def: def, byDomain: map[string]*client.Limiter{}}
	for d, p := range policies {
		o := base
		if p.Deadline > 0 {
			o.Deadline = p.Deadline
		}
		if p.HasFallback {
			o.Fallback = p.Fallback
		}
		l, err := client.New(vk, o)
		if err != nil {
			return nil, fmt.Errorf("policy of domain %q: %w", d, err)
		}
		ls.byDomain[d] = l
	}
	return ls, nil
}

// For is the Limiter of domain: its LimiterFor.
func (ls *Limiters) For(domain string) *client.Limiter {
	if l := ls.byDomain[domain]; l != nil {
		return l
	}
	return ls.def
}

// Check verifies that every primary runs release need or later (see client.CheckVersion).
func (ls *Limiters) Check(ctx context.Context, need string) error {
	return ls.def.CheckVersion(ctx, need)
}

// Close closes every Limiter (see client.Limiter.Close), after the last request.
func (ls *Limiters) Close(ctx context.Context) error {
	errs := []error{ls.def.Close(ctx)}
	for _, l := range ls.byDomain {
		errs = append(errs, l.Close(ctx))
	}
	return errors.Join(errs...)
}
