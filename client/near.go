package client

import (
	"context"
)

// nearby is what Options.BudgetBatch and DenialCache turn on: the Allow calls a Limiter
// answers without its server, from units it took in batches (budget.go) and from recent
// denials (denial.go). nil when neither is set.
type nearby struct {
	budgets *budgets // nil without BudgetBatch
	denials *denials // nil without DenialCache
}

// allowNear decides c with the denial cache and the leased budgets, which answer without the
// server when they can. Their state key begins with the server key, which decide then takes
// as it is, with the clock reading made here (when the denial cache made one).
func (l *Limiter) allowNear(ctx context.Context, key string, c call) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	var b [192]byte
	sk, n := l.stateKey(b[:0], key, c)
	d := l.near.denials
	if d != nil && d.shut.Load() {
		d = nil
	}
	bs := l.near.budgets
	leased := bs != nil && !bs.isShut.Load() && c.leasable()
	var sent int64 // 0: not read; a cold key's budget lookup reads it then
	if d != nil {
		sent = l.clock()
		if r, ok := d.get(sk, n, c.cost, sent); ok {
			l.tel.countCached(ctx, c, r)
			return r, nil
		}
	}
	var res Result
	var err error
	if leased {
		res, err = l.allowLeased(ctx, sk, n, key, c, sent)
	} else {
		res, err = l.decide(ctx, opAllow, key, c, built{key: sk[:n], now: sent})
	}
	if d != nil && err == nil && !res.Allowed && res.Source != FromFallback && res.Source != FromDenialCache {
		d.put(sk, n, c.cost, sent, l.clock(), res)
	}
	return res, err
}

// dropDenials forgets the denials of the server key sk: a refund through this Limiter may
// admit them now.
func (l *Limiter) dropDenials(sk []byte) {
	if l.near == nil || l.near.denials == nil {
		return
	}
	l.near.denials.drop(sk)
}
