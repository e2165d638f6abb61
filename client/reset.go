package client

import (
	"context"
	"strings"

	"github.com/rlfn/rlfn/internal/keys"
)

// Reset gives key a fresh start: it deletes, in one command, the server state of key's
// limiters of limits (with none given, of every algorithm's unnamed limiter of key, a
// Concurrency limit's leases included), and drops what this process holds for key: the units
// its leased budgets parked (they were taken at the server, whose count Reset deletes), its
// cached denials and its local fallback state. It returns how many server keys it deleted.
// The principal's block is not a limit: Unblock lifts it.
//
// A named limit is reset only when given (the server's keys have no list of names; rlfn reset
// finds them all). Other processes keep, for a while, what they hold of key: a leased budget's
// parked units until BudgetAge has passed since they were taken (admissions the server
// counted before the reset), a cached denial until its RetryAfter (a refusal, never an
// admission too many), local fallback state until the server decides key again there.
//
// Like Block, Reset is an operator's call: it goes to the server within the Limiter's
// deadline, and what fails is returned, never decided by the Fallback.
func (l *Limiter) Reset(ctx context.Context, key string, limits ...Limit) (int64, error) {
	if err := l.checkKey(key); err != nil {
		return 0, err
	}
	var names []string
	if len(limits) == 0 {
		for _, a := range algorithms {
			if a != blockAlg {
				names = append(names, string(keys.Append(nil, l.prefix, key, a.name, "")))
			}
		}
	}
	for _, limit := range limits {
		if isNil(limit) {
			return 0, &LimitError{Field: "limit", Reason: "must not be nil"}
		}
		names = append(names, l.Key(key, limit))
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.deadline)
	defer cancel()
	n, err := l.vk.Do(ctx, l.vk.B().Del().Key(names...).Build()).AsInt64()
	if err != nil {
		return 0, err
	}
	l.forget(string(keys.Append(nil, l.prefix, key, "", "")))
	return n, nil
}

// forget drops what this process holds of the server keys that start with principal (a
// principal's keys up to the ':' before the algorithm): parked units, denials, local state.
func (l *Limiter) forget(principal string) {
	if l.near != nil {
		if d := l.near.denials; d != nil {
			d.dropPrincipal([]byte(principal))
		}
		if bs := l.near.budgets; bs != nil {
			bs.dropPrincipal(principal)
		}
	}
	if l.local != nil {
		l.local.dropPrincipal(principal)
	}
}

// dropPrincipal forgets the budgets of the server keys that start with principal, parked units
// and all: the server's count they were taken from is gone.
func (bs *budgets) dropPrincipal(principal string) {
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		for k, b := range sh.m {
			if !strings.HasPrefix(k, principal) {
				continue
			}
			b.mu.Lock()
			b.units = 0
			if b.timer != nil {
				b.timer.Stop()
			}
			sh.drop(k, b)
			b.mu.Unlock()
		}
		sh.mu.Unlock()
	}
}

// dropPrincipal forgets the local state of the server keys that start with principal.
func (s *localStore) dropPrincipal(principal string) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			if strings.HasPrefix(k, principal) {
				delete(sh.m, k)
				s.keys.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
