package main

import (
	"testing"

	"github.com/rlfn/rlfn/internal/harness"
)

// In a FROM scratch image there is no CA bundle: the binary carries Go's copy of the public
// roots, so that a rediss:// server with a public certificate is verified without --tls-ca or
// $RLFN_TLS_CA (the deploy Job of a chart without serverCA).
func TestFallbackRoots(t *testing.T) { harness.FallbackRoots(t, "TestFallbackRoots") }
