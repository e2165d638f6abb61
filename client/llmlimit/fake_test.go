package llmlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

// fake is an opener over budgets kept in the process, by rule Name: what the middleware does
// with a meter's answers, apart from what the server does (tested on real servers).
type fake struct {
	mu      sync.Mutex
	limit   map[string]int64 // by rule Name; a rule without one has no limit
	charged map[string]int64 // charged and held
	opened  [][]client.Rule
	settled [][]int64
	takeErr error // Take's error, once set
}

func newFake(limits map[string]int64) *fake {
	return &fake{limit: limits, charged: map[string]int64{}}
}

func (f *fake) room(name string) int64 {
	l, ok := f.limit[name]
	if !ok {
		return 1 << 62
	}
	return l - f.charged[name]
}

func (f *fake) open(_ context.Context, rules []client.Rule, spec meterSpec) (meter, client.Result, []client.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, rules)
	each := make([]client.Result, len(rules))
	res := client.Result{Allowed: true, Remaining: 1 << 62}
	for i, r := range rules {
		room := f.room(r.Name)
		each[i] = client.Result{Allowed: r.Cost <= room, Limit: f.limit[r.Name], Remaining: max(room-r.Cost, 0), ResetAfter: time.Minute}
		if r.Cost > room && res.Allowed {
			res = each[i]
			res.Remaining, res.RetryAfter, res.Rule = room, 1500*time.Millisecond, i
		} else if res.Allowed && each[i].Remaining < res.Remaining {
			res = each[i]
			res.Rule = i
		}
	}
	if !res.Allowed {
		return nil, res, nil, nil
	}
	held := make([]int64, len(rules))
	for i, r := range rules {
		f.charged[r.Name] += r.Cost
		held[i] = r.Cost
	}
	return &fakeMeter{f: f, rules: rules, spec: spec, held: held}, res, each, nil
}

// settledAfter is what the meters settled, once n have: a response whose length the upstream
// said ends for its client before the middleware settles it.
func (f *fake) settledAfter(t *testing.T, n int) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		got := fmt.Sprint(f.settled)
		done := len(f.settled) >= n
		f.mu.Unlock()
		if done || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

type fakeMeter struct {
	f       *fake
	rules   []client.Rule
	spec    meterSpec
	held    []int64
	used    int64
	settled bool
	res     client.Result
}

// Take takes what the units need beyond what is held, all or nothing; when they do not fit,
// it holds what fits and answers false.
func (m *fakeMeter) Take(_ context.Context, n int64) (bool, error) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.takeErr != nil {
		return false, f.takeErr
	}
	m.used += n
	fits := true
	for i, r := range m.rules {
		need := m.spec.base[i] + m.used*m.spec.perUnit[i] - m.held[i]
		if need > f.room(r.Name) && fits {
			fits = false
			m.res = client.Result{Limit: f.limit[r.Name], Rule: i}
		}
	}
	for i, r := range m.rules {
		need := m.spec.base[i] + m.used*m.spec.perUnit[i] - m.held[i]
		if need > 0 {
			need = min(need, f.room(r.Name))
			f.charged[r.Name] += need
			m.held[i] += need
		}
	}
	return fits, nil
}

func (m *fakeMeter) Result() client.Result {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	return m.res
}

func (m *fakeMeter) Settle(_ context.Context, actual []int64) (client.Result, error) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if m.settled {
		return client.Result{}, errors.New("settled twice")
	}
	m.settled = true
	f.settled = append(f.settled, actual)
	for i, r := range m.rules {
		d := actual[i] - m.held[i]
		if d > 0 {
			d = min(d, f.room(r.Name))
		}
		f.charged[r.Name] += d
	}
	return client.Result{Allowed: true}, nil
}

// free is an opener whose meters grant everything at no cost, for benchmarks.
type free struct{}

func (free) open(_ context.Context, rules []client.Rule, _ meterSpec) (meter, client.Result, []client.Result, error) {
	each := make([]client.Result, len(rules))
	for i := range each {
		each[i] = client.Result{Allowed: true, Limit: 1000, Remaining: 999}
	}
	return freeMeter{}, client.Result{Allowed: true, Limit: 1000, Remaining: 999}, each, nil
}

type freeMeter struct{}

func (freeMeter) Take(context.Context, int64) (bool, error) { return true, nil }
func (freeMeter) Result() client.Result                     { return client.Result{Allowed: true} }
func (freeMeter) Settle(context.Context, []int64) (client.Result, error) {
	return client.Result{Allowed: true}, nil
}
