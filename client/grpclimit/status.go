package grpclimit

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rlfn/rlfn/client"
)

// refusal is the status of a refused call: ResourceExhausted (never Unavailable, which
// clients and meshes retry at once), with a google.rpc.RetryInfo of the exact wait unless none
// helps (client.Never), and a google.rpc.QuotaFailure naming the violated policy unless the
// quota is hidden. blocked says the principal's block refused it.
func refusal(hide, blocked bool, policy string, wait time.Duration) error {
	msg := "grpclimit: rate limited by policy " + policy
	switch {
	case hide:
		msg = "grpclimit: rate limited"
	case blocked:
		msg += ": blocked by a penalty for exceeding the quota or by an operator"
	}
	st := status.New(codes.ResourceExhausted, msg)
	var details [2]protoadapt.MessageV1
	n := 0
	if wait != client.Never {
		details[n] = &errdetails.RetryInfo{RetryDelay: durationpb.New(max(wait, 0))}
		n++
	}
	if !hide {
		desc := "rate limit exceeded"
		if blocked {
			desc = "blocked"
		}
		details[n] = &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: "policy:" + policy, QuotaId: policy, Description: desc,
		}}}
		n++
	}
	if n > 0 {
		if d, err := st.WithDetails(details[:n]...); err == nil {
			st = d
		}
	}
	return st.Err()
}
