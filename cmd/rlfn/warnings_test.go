package main

import (
	"testing"

	"github.com/rlfn/rlfn/deployer"
)

// TestNotAccepted: warnings are counted as printed, one per kind and text, whatever the number
// of nodes each names: a cluster of six nodes of one server version has one warning, not six.
func TestNotAccepted(t *testing.T) {
	lua := func(addr string) deployer.Warning {
		return deployer.Warning{ID: deployer.WarnLuaSecurity, Addr: addr, Text: "Valkey 8.0.1 lacks known Lua security fixes"}
	}
	cov := func(addr, text string) deployer.Warning {
		return deployer.Warning{ID: deployer.WarnFullCoverage, Addr: addr, Text: text}
	}
	six := []deployer.Warning{lua(":1"), lua(":2"), lua(":3"), lua(":4"), lua(":5"), lua(":6")}
	for _, tt := range []struct {
		name string
		ok   map[string]bool
		give []deployer.Warning
		want string // "" for nil
	}{
		{"none", nil, nil, ""},
		{"one about six nodes", nil, six,
			"1 warning not accepted (lua-security): review, then pass --accept-warning lua-security (or set RLFN_ACCEPT_WARNINGS) to exit 0"},
		{"two texts of one kind", nil, append(six[:2:2], cov(":1", "is yes"), cov(":2", "could not be read"), cov(":3", "is yes")),
			"3 warnings not accepted (lua-security, full-coverage): review, then pass --accept-warning lua-security,full-coverage (or set RLFN_ACCEPT_WARNINGS) to exit 0"},
		{"one kind accepted", map[string]bool{"lua-security": true}, append(six, cov(":1", "is yes"), cov(":2", "is yes")),
			"1 warning not accepted (full-coverage): review, then pass --accept-warning full-coverage (or set RLFN_ACCEPT_WARNINGS) to exit 0"},
		{"all accepted", map[string]bool{"lua-security": true, "full-coverage": true}, append(six, cov(":1", "is yes")), ""},
	} {
		err := notAccepted(tt.ok, tt.give)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", tt.name, err)
		case tt.want != "" && (err == nil || err.Error() != tt.want):
			t.Errorf("%s: %v\nwant %s", tt.name, err, tt.want)
		}
	}
}
