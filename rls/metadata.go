package rls

import (
	"fmt"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is the response's dynamic metadata as the reference sends it with
// RESPONSE_DYNAMIC_METADATA: the domain, the request's descriptors (entries as "key=value",
// a limit override, a descriptor's own hits_addend), the request's hits_addend when set, and
// the metadata of the configuration's descriptors that were not over their limits, merged
// (the first value of a key wins; structs merge).
func dynamicMetadata(req *pb.RateLimitRequest, ds []*descriptor) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.Domain)}
	var list []*structpb.Value
	for _, d := range req.Descriptors {
		var entries []*structpb.Value
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(fmt.Sprintf("%s=%s", e.GetKey(), e.GetValue())))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.GetLimit() != nil {
			f["limit"] = structpb.NewStringValue(d.GetLimit().String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, d := range ds {
		if d.rl == nil || d.rl.Unlimited || d.rl.Metadata == nil || d.status.Code == pb.RateLimitResponse_OVER_LIMIT {
			continue
		}
		merge(passed, d.rl.Metadata)
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

func merge(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		cur, ok := dst.Fields[k]
		if !ok {
			// A copy: the configuration's own metadata is shared by every request.
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if a, b := cur.GetStructValue(), v.GetStructValue(); a != nil && b != nil {
			merge(a, b)
		}
	}
}
