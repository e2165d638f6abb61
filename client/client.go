package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Limiter makes rate-limiting decisions with the ratelimit library's functions. It is safe for
// concurrent use; its only state is its configuration.
type Limiter struct {
	vk     valkey.Client
	prefix string // escaped, as Key writes it
}

// Option configures a Limiter.
type Option func(*options)

type options struct {
	prefix string
}

// WithPrefix sets the prefix of every key (see Key). Default: DefaultPrefix, "rl:". The prefix
// never chooses a cluster slot: its braces are escaped like the key's.
func WithPrefix(prefix string) Option {
	return func(o *options) { o.prefix = prefix }
}

// New returns a Limiter that sends its commands through vk. The caller owns vk: the Limiter
// never dials, and never closes it. Read-only commands (Peek) go where vk sends them, e.g. to
// replicas with valkey.ClientOption.SendToReplicas.
func New(vk valkey.Client, opts ...Option) *Limiter {
	o := options{prefix: DefaultPrefix}
	for _, opt := range opts {
		opt(&o)
	}
	return &Limiter{vk: vk, prefix: string(appendEscaped(nil, o.prefix))}
}

// Allow takes one unit from key's limiter.
func (l *Limiter) Allow(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.AllowN(ctx, key, limit, 1)
}

// AllowN takes n units (0 to 999999999999999) from key's limiter, all or nothing: a denied
// call consumes nothing. An n above the limit is denied with RetryAfter = Never.
func (l *Limiter) AllowN(ctx context.Context, key string, limit Limit, n int64) (Result, error) {
	c, err := prepare(limit, n)
	if err != nil {
		return Result{}, err
	}
	return decode(c.fn.name, l.vk.Do(ctx, l.command(false, c.fn.name, key, c)))
}

// Peek reports whether one unit would be admitted now, consuming nothing.
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.PeekN(ctx, key, limit, 1)
}

// PeekN reports whether n units would be admitted now, consuming nothing. It runs the peek
// function with FCALL_RO, so a client that sends read-only commands to replicas runs it on a
// replica, whose state lags the primary's by the replication delay. A replica that has no
// library yet (a deploy in progress) is skipped: the call is repeated on the primary.
func (l *Limiter) PeekN(ctx context.Context, key string, limit Limit, n int64) (Result, error) {
	c, err := prepare(limit, n)
	if err != nil {
		return Result{}, err
	}
	res, err := decode(c.fn.peek, l.vk.Do(ctx, l.command(true, c.fn.peek, key, c)))
	if errors.Is(err, ErrNotLoaded) {
		// FCALL is not read-only, so every client sends it to the primary; the peek function
		// runs under FCALL as well (no-writes only permits FCALL_RO, it does not require it).
		res, err = decode(c.fn.peek, l.vk.Do(ctx, l.command(false, c.fn.peek, key, c)))
	}
	return res, err
}

func prepare(limit Limit, n int64) (call, error) {
	if limit == nil {
		return call{}, &LimitError{Field: "limit", Reason: "must not be nil"}
	}
	if err := limit.Validate(); err != nil {
		return call{}, err
	}
	if err := checkCost(n); err != nil {
		return call{}, err
	}
	return limit.args(n), nil
}

// command builds FCALL (or FCALL_RO) fn 1 key args... A command is built for each call and
// never reused, because valkey-go recycles it once Do returns; so it needs no Pin.
func (l *Limiter) command(readOnly bool, fn, key string, c call) valkey.Completed {
	// The key and every number are written into one buffer and converted to one string that
	// the arguments slice: one allocation per call rather than one per argument.
	var b [128]byte
	buf := appendKey(b[:0], l.prefix, key, c.fn.algorithm)
	var ends [len(c.nums) + 1]int
	ends[0] = len(buf)
	for i, v := range c.nums[:c.n] {
		buf = strconv.AppendInt(buf, v, 10)
		ends[i+1] = len(buf)
	}
	s := string(buf)
	var argv [len(c.nums) + 1]string
	args := argv[:0]
	for i := range c.n {
		args = append(args, s[ends[i]:ends[i+1]])
	}
	if c.mode != "" {
		args = append(args, c.mode)
	}
	k := s[:ends[0]]
	if readOnly {
		return l.vk.B().FcallRo().Function(fn).Numkeys(1).Key(k).Arg(args...).Build()
	}
	return l.vk.B().Fcall().Function(fn).Numkeys(1).Key(k).Arg(args...).Build()
}

// maxMs is the largest number of milliseconds a time.Duration holds.
const maxMs = int64(1<<63-1) / int64(time.Millisecond)

// decode turns fn's reply into a Result, or into this package's error for it.
func decode(fn string, res valkey.ValkeyResult) (Result, error) {
	if err := res.Error(); err != nil && !valkey.IsValkeyNil(err) {
		return Result{}, replyErr(fn, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return Result{}, &ReplyError{Function: fn, Reason: err.Error()}
	}
	// Within a major version the reply may grow: later elements are for later clients.
	if len(arr) < 6 {
		return Result{}, &ReplyError{Function: fn, Reason: fmt.Sprintf("%d elements, want 6", len(arr))}
	}
	var v [6]int64
	for i := range v {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return Result{}, &ReplyError{Function: fn, Reason: fmt.Sprintf("element %d is not an integer: %v", i+1, err)}
		}
	}
	allowed, limit, remaining, retry, reset, delay := v[0], v[1], v[2], v[3], v[4], v[5]
	switch {
	case allowed != 0 && allowed != 1:
		return Result{}, &ReplyError{Function: fn, Reason: fmt.Sprintf("allowed is %d, want 0 or 1", allowed)}
	case remaining < 0:
		return Result{}, &ReplyError{Function: fn, Reason: fmt.Sprintf("remaining is %d", remaining)}
	case retry < -1 || retry > maxMs || reset < 0 || reset > maxMs || delay < 0 || delay > maxMs:
		return Result{}, &ReplyError{Function: fn, Reason: fmt.Sprintf(
			"durations out of range: retry_after_ms %d, reset_after_ms %d, delay_ms %d", retry, reset, delay)}
	}
	r := Result{
		Allowed:    allowed == 1,
		Limit:      limit,
		Remaining:  remaining,
		RetryAfter: time.Duration(retry) * time.Millisecond,
		ResetAfter: time.Duration(reset) * time.Millisecond,
		Delay:      time.Duration(delay) * time.Millisecond,
	}
	if retry == -1 {
		r.RetryAfter = Never
	}
	return r, nil
}

// replyErr classifies an error reply: RLERR, a missing function, or anything else (the
// network, the context, another server error), which is wrapped so that errors.Is still sees
// context.DeadlineExceeded or a *valkey.ValkeyError.
func replyErr(fn string, err error) error {
	if verr, ok := valkey.IsValkeyErr(err); ok {
		msg := verr.Error()
		if rest, ok := strings.CutPrefix(msg, "RLERR "); ok {
			return &LibraryError{Function: fn, Message: rest}
		}
		if notFound(msg) {
			return ErrNotLoaded
		}
	}
	return fmt.Errorf("rlfn: %s: %w", fn, err)
}

// notFound reports the server's answer to FCALL of a function it does not have ("ERR
// Function not found"; valkey-go strips the "ERR ").
func notFound(msg string) bool {
	return strings.HasPrefix(msg, "Function not found")
}
