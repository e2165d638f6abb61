package main

import (
	"errors"
	"testing"

	"github.com/rlfn/rlfn/deployer"
)

// TestForceAdvice: the deployer's refusal names each node and its safety check; the CLI adds
// the flag that overrides it, to a refusal only, and the exit code stays the refusal's.
func TestForceAdvice(t *testing.T) {
	refused := &deployer.RefusedError{Steps: fixturePlan.Refused()}
	unsupported := &deployer.UnsupportedError{Steps: fixturePlan.Unsupported()}
	tests := []struct {
		name     string
		give     error
		want     string
		wantExit int
	}{
		{name: "refused", give: refused, want: refused.Error() + " (use --force)", wantExit: exitRefused},
		{name: "unsupported: forcing does not help", give: unsupported, want: unsupported.Error(), wantExit: exitError},
		{name: "another error", give: deployer.ErrStalePlan, want: deployer.ErrStalePlan.Error(), wantExit: exitError},
		{name: "none", wantExit: exitOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := forceAdvice(tt.give)
			if (got == nil) != (tt.want == "") || got != nil && got.Error() != tt.want {
				t.Errorf("got  %v\nwant %s", got, tt.want)
			}
			if !errors.Is(got, tt.give) {
				t.Errorf("%v does not wrap %v", got, tt.give)
			}
			if code := exitCode(got); code != tt.wantExit {
				t.Errorf("exit %d, want %d", code, tt.wantExit)
			}
		})
	}
}
