package grpclimit

import (
	"sync/atomic"
	"time"
	"unsafe"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rlfn/rlfn/client"
)

// The type URLs of the details of a refusal.
const (
	typeRetryInfo    = "type.googleapis.com/google.rpc.RetryInfo"
	typeQuotaFailure = "type.googleapis.com/google.rpc.QuotaFailure"
)

// refusalSlots is how many refusals' statuses a Server keeps, by their wait: a refusal costs
// gRPC 9 allocations to copy its status (status.FromProto clones it), and the refusals of one
// policy have few waits, to the millisecond (a token bucket of 10 a second refuses with one
// of 100; a fixed window refuses every principal with the wait to its end, as windows are
// aligned). A slot holds about 900 bytes (this and gRPC's copy): 128 of them hold a flood's
// statuses in 120 KB.
const refusalSlots = 128

// refusals are the statuses of recent refusals, a slot per wait (direct-mapped): lock-free,
// bounded, and a miss costs one atomic store. A status is immutable and gRPC only reads it
// (it marshals it into the call's trailer), so calls share one.
type refusals [refusalSlots]atomic.Pointer[refusalParts]

// refusalParts is a refusal's status, the parts it is built of, and what it says: one
// allocation for all that is the interceptor's own (FromProto copies the rest).
type refusalParts struct {
	policy        string
	wait          time.Duration
	hide, blocked bool
	err           error
	st            spb.Status
	details       [2]*anypb.Any
	anys          [2]anypb.Any
	// the message, then the details' values: written once, before anything points into it.
	// 192 bytes hold a refusal by a policy of a name up to 38 bytes (11 for a block's longer
	// message) and keep the whole in 512 bytes; a longer one takes an array of its own.
	buf [192]byte
}

// refuse is the status of a refusal, shared with a recent one that says the same.
func (r *refusals) refuse(hide, blocked bool, policy string, wait time.Duration) error {
	slot := &r[uint64(wait/time.Millisecond)%refusalSlots]
	if p := slot.Load(); p != nil && p.wait == wait && p.policy == policy && p.hide == hide && p.blocked == blocked {
		return p.err
	}
	p := refusal(hide, blocked, policy, wait)
	slot.Store(p)
	return p.err
}

// refusal is the status of a refused call: ResourceExhausted (never Unavailable, which
// clients and meshes retry at once), with a google.rpc.RetryInfo of the exact wait unless none
// helps (client.Never), and a google.rpc.QuotaFailure naming the violated policy unless the
// quota is hidden. blocked says the principal's block refused it.
//
// The details are encoded by hand into one buffer, as httplimit writes its 429 body: a
// refusal is the path a flood takes, and marshalling two messages by reflection tripled its
// cost. A client decodes them as any other (errdetails.RetryInfo, errdetails.QuotaFailure).
func refusal(hide, blocked bool, policy string, wait time.Duration) *refusalParts {
	return refusalAs(false, hide, blocked, policy, wait)
}

// cutStatus is the status of a stream cut because its budget ran out (Policy.Meter): a
// refusal's, whose message says so, and whose RetryInfo is the wait the refused batch's reply
// gave.
func cutStatus(hide bool, policy string, wait time.Duration) error {
	return refusalAs(true, hide, false, policy, wait).err
}

// refusalAs is refusal, or with cut the status of a stream cut by its meter.
func refusalAs(cut, hide, blocked bool, policy string, wait time.Duration) *refusalParts {
	a := &refusalParts{policy: policy, wait: wait, hide: hide, blocked: blocked}
	buf := a.buf[:0]
	switch {
	case cut && hide:
		buf = append(buf, "grpclimit: budget ran out: the stream is cut"...)
	case cut:
		buf = append(append(append(buf, "grpclimit: budget of policy "...), policy...), " ran out: the stream is cut"...)
	default:
		buf = append(buf, "grpclimit: rate limited"...)
		if !hide {
			buf = append(append(buf, " by policy "...), policy...)
			if blocked {
				buf = append(buf, ": blocked by a penalty for exceeding the quota or by an operator"...)
			}
		}
	}
	msg := buf
	n := 0
	if wait != client.Never {
		wait = max(wait, 0)
		// RetryInfo{retry_delay: Duration{seconds, nanos}}
		var d [24]byte
		dur := d[:0]
		if s := int64(wait / time.Second); s != 0 {
			dur = protowire.AppendVarint(protowire.AppendTag(dur, 1, protowire.VarintType), uint64(s))
		}
		if ns := int64(wait % time.Second); ns != 0 {
			dur = protowire.AppendVarint(protowire.AppendTag(dur, 2, protowire.VarintType), uint64(ns))
		}
		from := len(buf)
		buf = protowire.AppendBytes(protowire.AppendTag(buf, 1, protowire.BytesType), dur)
		a.anys[n] = anypb.Any{TypeUrl: typeRetryInfo, Value: buf[from:len(buf):len(buf)]}
		a.details[n] = &a.anys[n]
		n++
	}
	if !hide {
		desc := "rate limit exceeded"
		switch {
		case cut:
			desc = "budget ran out"
		case blocked:
			desc = "blocked"
		}
		// QuotaFailure{violations: [Violation{subject: "policy:<policy>", description, quota_id: policy}]}
		var v [128]byte
		viol := protowire.AppendTag(v[:0], 1, protowire.BytesType)
		viol = protowire.AppendVarint(viol, uint64(len("policy:")+len(policy)))
		viol = append(append(viol, "policy:"...), policy...)
		viol = protowire.AppendString(protowire.AppendTag(viol, 2, protowire.BytesType), desc)
		viol = protowire.AppendString(protowire.AppendTag(viol, 5, protowire.BytesType), policy)
		from := len(buf)
		buf = protowire.AppendBytes(protowire.AppendTag(buf, 1, protowire.BytesType), viol)
		a.anys[n] = anypb.Any{TypeUrl: typeQuotaFailure, Value: buf[from:len(buf):len(buf)]}
		a.details[n] = &a.anys[n]
		n++
	}
	// A buffer that did not hold it all was copied by append: the message and the values
	// point into whichever array holds them, never written after.
	a.st = spb.Status{Code: int32(codes.ResourceExhausted), Message: unsafe.String(unsafe.SliceData(msg), len(msg)), Details: a.details[:n]}
	a.err = status.FromProto(&a.st).Err()
	return a
}
