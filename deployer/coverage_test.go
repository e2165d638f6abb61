package deployer

import (
	"errors"
	"strings"
	"testing"
)

// TestCoverageWarning: only "no" keeps a node answering while a shard has no primary; yes and
// a setting that could not be read are warned of, each saying what to do.
func TestCoverageWarning(t *testing.T) {
	for _, tt := range []struct {
		give string
		err  error
		want []string // "" when no warning
	}{
		{give: "no"},
		{give: "yes", want: []string{"cluster-require-full-coverage is yes:", "CLUSTERDOWN", "CONFIG SET cluster-require-full-coverage no, and CONFIG REWRITE or the config file"}},
		{err: errors.New("CONFIG GET cluster-require-full-coverage: NOPERM User deployer has no permissions to run the 'config|get' command"),
			want: []string{"could not be read (CONFIG GET cluster-require-full-coverage: NOPERM", "if it is yes, the default", "make sure it is no"}},
		{err: errors.New("CONFIG GET cluster-require-full-coverage: unknown command 'CONFIG'"), want: []string{"could not be read", "unknown command"}},
	} {
		w, ok := coverageWarning(tt.give, tt.err)
		if ok != (len(tt.want) > 0) {
			t.Errorf("%q, %v: warned %v (%q)", tt.give, tt.err, ok, w.Text)
			continue
		}
		if ok && w.ID != WarnFullCoverage {
			t.Errorf("%q, %v: ID %q", tt.give, tt.err, w.ID)
		}
		for _, part := range tt.want {
			if !strings.Contains(w.Text, part) {
				t.Errorf("%q, %v: %q does not say %q", tt.give, tt.err, w.Text, part)
			}
		}
	}
}
