package rls

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// escapingCodec is gRPC's proto codec, except that a request whose strings are not valid
// UTF-8 is decided with those strings escaped rather than refused. Envoy copies a header's
// bytes into a descriptor's value, and HTTP/1.1 lets a header carry bytes that are not UTF-8
// (obs-text): proto3 refuses such a string, gRPC answers INTERNAL before the service sees the
// request, and Envoy's default failure_mode_deny: false admits it. A client could so escape
// its limit with one byte in a header (envoyproxy/ratelimit is open to it the same way).
// Each invalid byte becomes the four characters \xHH, so that values differing in such bytes
// keep limits of their own (a value of the text \xe9 shares the byte 0xE9's: no escape can
// keep every value apart without changing valid ones).
type escapingCodec struct {
	encoding.CodecV2
	escaped func() // called once per request escaped
}

func newEscapingCodec(escaped func()) escapingCodec {
	return escapingCodec{CodecV2: encoding.GetCodecV2("proto"), escaped: escaped}
}

func (c escapingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	raw := data.Materialize()
	fixed, changed, ferr := escapeStrings(raw, m.ProtoReflect().Descriptor())
	if ferr != nil || !changed {
		return err
	}
	if err := proto.Unmarshal(fixed, m); err != nil {
		return err
	}
	if c.escaped != nil {
		c.escaped()
	}
	return nil
}

// escapeStrings returns b, a message of type md in the wire format, with the invalid UTF-8 of
// its string fields (and its messages', to any depth) escaped; changed says whether any was.
func escapeStrings(b []byte, md protoreflect.MessageDescriptor) (out []byte, changed bool, err error) {
	out = make([]byte, 0, len(b))
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		tag := b[:n]
		b = b[n:]
		if typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil, false, protowire.ParseError(m)
			}
			out = append(append(out, tag...), b[:m]...)
			b = b[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return nil, false, protowire.ParseError(m)
		}
		b = b[m:]
		switch fd := md.Fields().ByNumber(num); {
		case fd != nil && fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
			v, changed = []byte(escapeInvalid(v)), true
		case fd != nil && fd.Kind() == protoreflect.MessageKind && !fd.IsMap():
			inner, c, err := escapeStrings(v, fd.Message())
			if err != nil {
				return nil, false, err
			}
			v, changed = inner, changed || c
		}
		out = protowire.AppendBytes(append(out, tag...), v)
	}
	return out, changed, nil
}

// escapeInvalid writes each byte of b that is not part of valid UTF-8 as \xHH.
func escapeInvalid(b []byte) string {
	var s strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&s, `\x%02x`, b[0])
		} else {
			s.Write(b[:n])
		}
		b = b[n:]
	}
	return s.String()
}
