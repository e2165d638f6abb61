package main

import (
	"testing"

	"github.com/rlfn/rlfn/internal/harness"
)

// In a FROM scratch image there is no CA bundle: the binary carries Go's copy of the public
// roots, so that a rediss:// server with a public certificate is verified without
// REDIS_TLS_CACERT (Envoy Gateway never sets it).
func TestFallbackRoots(t *testing.T) { harness.FallbackRoots(t, "TestFallbackRoots") }
