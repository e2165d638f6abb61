package grpclimit

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Peer is a Key that counts calls per client IP address, as the connection reports it. Behind
// a proxy every call has the proxy's address: key by Metadata the proxy sets, or by identity.
func Peer(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", errors.New("grpclimit: the call has no peer")
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		return a.IP.String(), nil // one allocation, where Addr.String and a split are three
	}
	addr := p.Addr.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host, nil
	}
	return addr, nil // a unix socket's, or bufconn's: the whole address
}

// Metadata returns a Key that counts calls by the last value of the incoming metadata key name
// (lower case, as gRPC keeps them), e.g. "x-api-key". A call without it has an empty key,
// refused InvalidArgument. Any client can send any value: key a limit that protects against
// clients by something the server checked (TLSIdentity, or metadata an authenticating proxy
// or interceptor sets).
func Metadata(name string) Key {
	return func(ctx context.Context, _ string) (string, error) {
		v := metadata.ValueFromIncomingContext(ctx, name)
		if len(v) == 0 {
			return "", nil
		}
		return v[len(v)-1], nil
	}
}

// ErrNoIdentity is TLSIdentity's error for a call whose client presented no verified
// certificate.
var ErrNoIdentity = errors.New("grpclimit: the call has no verified client certificate")

// TLSIdentity is a Key that counts calls by the identity the server authenticated: the
// SPIFFE ID of the client's verified certificate when it has one, else its subject's common
// name. A call over a connection without a verified client certificate (no mutual TLS) is
// refused with ErrNoIdentity.
func TLSIdentity(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", ErrNoIdentity
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", ErrNoIdentity
	}
	if info.SPIFFEID != nil {
		return info.SPIFFEID.String(), nil
	}
	if cn := info.State.VerifiedChains[0][0].Subject.CommonName; cn != "" {
		return cn, nil
	}
	return "", ErrNoIdentity
}
