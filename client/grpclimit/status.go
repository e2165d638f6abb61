package grpclimit

import (
	"time"

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

// refusalParts are the parts of a refusal's status.
type refusalParts struct {
	buf     [160]byte
	details [2]*anypb.Any
	anys    [2]anypb.Any
}

// refusal is the status of a refused call: ResourceExhausted (never Unavailable, which
// clients and meshes retry at once), with a google.rpc.RetryInfo of the exact wait unless none
// helps (client.Never), and a google.rpc.QuotaFailure naming the violated policy unless the
// quota is hidden. blocked says the principal's block refused it.
//
// The details are encoded by hand into one buffer, as httplimit writes its 429 body: a
// refusal is the path a flood takes, and marshalling two messages by reflection tripled its
// cost. A client decodes them as any other (errdetails.RetryInfo, errdetails.QuotaFailure).
func refusal(hide, blocked bool, policy string, wait time.Duration) error {
	msg := "grpclimit: rate limited"
	switch {
	case hide:
	case blocked:
		msg = "grpclimit: rate limited by policy " + policy + ": blocked by a penalty for exceeding the quota or by an operator"
	default:
		msg = "grpclimit: rate limited by policy " + policy
	}
	// One allocation for what the status is built of: FromProto copies it all.
	a := new(refusalParts)
	buf, details, anys := a.buf[:0], &a.details, &a.anys
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
		anys[n] = anypb.Any{TypeUrl: typeRetryInfo, Value: buf[from:len(buf):len(buf)]}
		details[n] = &anys[n]
		n++
	}
	if !hide {
		desc := "rate limit exceeded"
		if blocked {
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
		anys[n] = anypb.Any{TypeUrl: typeQuotaFailure, Value: buf[from:len(buf):len(buf)]}
		details[n] = &anys[n]
		n++
	}
	return status.FromProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: msg, Details: details[:n]}).Err()
}
