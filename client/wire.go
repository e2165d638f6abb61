package client

import (
	"fmt"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// The wire: the commands a call sends and the decoding of their replies, strict to the
// library's contract (docs/library.md).

// command builds FCALL (or FCALL_RO) fn 1 key args... [reserve], with the server key sk. A
// command is built for each call and never
// reused, because valkey-go recycles it once Do returns; so it needs no Pin.
func (l *Limiter) command(readOnly bool, fn string, sk []byte, c call, reserve bool) valkey.Completed {
	// The key and every argument are written into one buffer and converted to one string that
	// the arguments slice: one allocation per call rather than one per argument.
	var b [192]byte
	var e [8]int
	buf := append(b[:0], sk...)
	ends := append(e[:0], len(buf))
	buf, ends = c.appendArgs(buf, ends)
	if reserve {
		buf = appendInt(buf, c.reserve)
		ends = append(ends, len(buf))
	}
	s := string(buf)
	var argv [len(e)]string
	args := argv[:0]
	for i := 1; i < len(ends); i++ {
		args = append(args, s[ends[i-1]:ends[i]])
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
	r, _, err := decodeN(fn, res, 6)
	return r, err
}

// decodeN decodes a reply of at least n integers (6, or 7 for rl_multi, whose seventh is the
// binding limit's 1-based index, returned as the second value).
func decodeN(fn string, res valkey.ValkeyResult, n int) (Result, int64, error) {
	if err := res.Error(); err != nil && !valkey.IsValkeyNil(err) {
		return Result{}, 0, replyErr(fn, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return Result{}, 0, &replyError{Function: fn, Reason: err.Error()}
	}
	// Within a major version the reply may grow: later elements are for later clients.
	if len(arr) < n {
		return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("%d elements, want %d", len(arr), n)}
	}
	var v [7]int64
	for i := range n {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return Result{}, 0, &replyError{Function: fn, Reason: fmt.Sprintf("element %d is not an integer: %v", i+1, err)}
		}
	}
	r, err := sixOf(fn, v[:6])
	if err != nil {
		return Result{}, 0, err
	}
	return r, v[6], nil
}

// decodeInts decodes a reply of at least n integers, all of them (rl_hold's eight, rl_multi's
// with replies), or the error the reply is.
func decodeInts(fn string, res valkey.ValkeyResult, n int) ([]int64, error) {
	if err := res.Error(); err != nil && !valkey.IsValkeyNil(err) {
		return nil, replyErr(fn, err)
	}
	arr, err := res.ToArray()
	if err != nil {
		return nil, &replyError{Function: fn, Reason: err.Error()}
	}
	if len(arr) < n {
		return nil, &replyError{Function: fn, Reason: fmt.Sprintf("%d elements, want %d", len(arr), n)}
	}
	v := make([]int64, len(arr))
	for i := range arr {
		if v[i], err = arr[i].ToInt64(); err != nil {
			return nil, &replyError{Function: fn, Reason: fmt.Sprintf("element %d is not an integer: %v", i+1, err)}
		}
	}
	return v, nil
}

// sixOf is the Result of the library's six integers, v[:6], or why they break its contract.
func sixOf(fn string, v []int64) (Result, error) {
	allowed, limit, remaining, retry, reset, delay := v[0], v[1], v[2], v[3], v[4], v[5]
	switch {
	case allowed != 0 && allowed != 1:
		return Result{}, &replyError{Function: fn, Reason: fmt.Sprintf("allowed is %d, want 0 or 1", allowed)}
	case remaining < 0:
		return Result{}, &replyError{Function: fn, Reason: fmt.Sprintf("remaining is %d", remaining)}
	case retry < -1 || retry > maxMs || reset < 0 || reset > maxMs || delay < 0 || delay > maxMs:
		return Result{}, &replyError{Function: fn, Reason: fmt.Sprintf(
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
	return fmt.Errorf("client: %s: %w", fn, err)
}

// notFound reports the server's answer to FCALL of a function it does not have ("ERR
// Function not found"; valkey-go strips the "ERR ").
func notFound(msg string) bool {
	return strings.HasPrefix(msg, "Function not found")
}

// function is the library function c runs for op.
func (c *call) function(op operation) string {
	switch op {
	case opPeek:
		return c.alg.peek
	case opRefund, opRelease:
		return c.alg.refund
	}
	return c.alg.fn
}

// sendsReserve reports whether c's command for op ends with the reserve argument: a limit with
// one, and a call that must be refundable (so that a 1.0 library refuses it before it takes
// anything).
func (c *call) sendsReserve(op operation) bool {
	return op != opRefund && op != opRelease && (c.reserve > 0 || c.refundable)
}
