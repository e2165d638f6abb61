package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrWaitPastDeadline is returned by Wait when the wait the limit asks for would end after
// ctx's deadline: Wait fails at once rather than sleeping to fail. It is errors.Is
// context.DeadlineExceeded.
var ErrWaitPastDeadline = fmt.Errorf("client: the wait for the limit would pass the context's deadline: %w", context.DeadlineExceeded)

// ErrCostOverLimit is returned by Wait for a cost that no wait admits: above the limit (with
// its reserve, unless ctx is Critical).
var ErrCostOverLimit = errors.New("client: the cost exceeds the limit: no wait admits it")

// Wait blocks until one unit of key's limit is admitted, as golang.org/x/time/rate's Wait
// does. See WaitN.
func (l *Limiter) Wait(ctx context.Context, key string, limit Limit) error {
	return l.WaitN(ctx, key, limit, 1)
}

// WaitN blocks until n units of key's limit are admitted: it calls AllowN, and while it is
// denied, sleeps for its RetryAfter and calls again (another caller may have taken the units
// meanwhile). It returns nil once admitted. A leaky bucket in Shape mode admits with a Delay:
// WaitN holds the call for it before returning.
//
// It fails at once, with nothing consumed, when the wait would end after ctx's deadline
// (ErrWaitPastDeadline; for a Delay, the admitted units are refunded first), and for a cost no
// wait admits (ErrCostOverLimit). When ctx ends during a wait it returns ctx.Err(). An error of
// AllowN (or ErrCircuitOpen under ReturnError) is returned as it is; under a Fallback, the
// Fallback's decision is waited on as the server's would be.
func (l *Limiter) WaitN(ctx context.Context, key string, limit Limit, n int64) error {
	for {
		res, err := l.AllowN(ctx, key, limit, n)
		if err != nil {
			return err
		}
		wait := res.RetryAfter
		if res.Allowed {
			wait = res.Delay
		}
		switch {
		case !res.Allowed && res.RetryAfter == Never:
			return ErrCostOverLimit
		case wait <= 0:
			return nil
		case pastDeadline(ctx, wait):
			if res.Allowed && n > 0 {
				// Shape mode's units are taken; the caller will not use them.
				if _, err := l.Refund(context.WithoutCancel(ctx), key, limit, n); err != nil {
					return errors.Join(ErrWaitPastDeadline, err)
				}
			}
			return ErrWaitPastDeadline
		}
		if err := sleep(ctx, wait); err != nil {
			if res.Allowed && n > 0 {
				// canceled during a Delay: give the units back, as for a deadline
				if _, rerr := l.Refund(context.WithoutCancel(ctx), key, limit, n); rerr != nil {
					return errors.Join(err, rerr)
				}
			}
			return err
		}
		if res.Allowed {
			return nil
		}
	}
}

// pastDeadline reports whether waiting d from now would end after ctx's deadline.
func pastDeadline(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) < d
}

// sleep waits d, or until ctx ends (its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
