package main

import (
	"os"
	"testing"

	"github.com/rlfn/rlfn/internal/envoyconf/reference"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// The reference's binaries, built once for the tests that run it beside rlfn-rls.
	reference.Remove()
	os.Exit(code)
}
