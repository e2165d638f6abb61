package deployer

import (
	"strings"
	"testing"
)

func TestServer(t *testing.T) {
	tests := []struct {
		name            string
		give            string // INFO server
		want            string
		wantUnsupported string // contained
		wantWarning     bool
		wantText        string // contained in the warning, when set
	}{
		// Valkey fixed them in 7.2.11, 8.0.6 and 8.1.4 (its 9.0 came out with them); its
		// redis_version (7.2.4) must not be read as Redis's.
		{name: "Valkey 8.0.1 lacks the Lua fixes", give: "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n", want: "Valkey 8.0.1", wantWarning: true},
		{name: "Valkey 7.2.10", give: "server_name:valkey\nvalkey_version:7.2.10\n", want: "Valkey 7.2.10", wantWarning: true},
		// Valkey 7.2 may name itself by server_name beside redis_version alone.
		{name: "Valkey 7.2.5 without valkey_version", give: "redis_version:7.2.5\nserver_name:valkey\n", want: "Valkey 7.2.5", wantWarning: true},
		{name: "Valkey 7.2.11", give: "server_name:valkey\nvalkey_version:7.2.11\n", want: "Valkey 7.2.11"},
		{name: "Valkey 8.0.5", give: "server_name:valkey\nvalkey_version:8.0.5\n", want: "Valkey 8.0.5", wantWarning: true},
		{name: "Valkey 8.0.6", give: "server_name:valkey\nvalkey_version:8.0.6\n", want: "Valkey 8.0.6"},
		{name: "Valkey 8.1.3", give: "server_name:valkey\nvalkey_version:8.1.3\n", want: "Valkey 8.1.3", wantWarning: true},
		{name: "Valkey 8.1.4", give: "server_name:valkey\nvalkey_version:8.1.4\n", want: "Valkey 8.1.4"},
		{name: "Valkey 9.0.0", give: "server_name:valkey\nvalkey_version:9.0.0\n", want: "Valkey 9.0.0"},
		{name: "Redis 7.0.15 lacks the Lua fixes", give: "# Server\r\nredis_version:7.0.15\r\n", want: "Redis 7.0.15", wantWarning: true},
		{name: "Redis 7.2.10", give: "redis_version:7.2.10\n", want: "Redis 7.2.10", wantWarning: true},
		{name: "Redis 7.2.11", give: "redis_version:7.2.11\n", want: "Redis 7.2.11"},
		{name: "Redis 7.4.5", give: "redis_version:7.4.5\n", want: "Redis 7.4.5", wantWarning: true},
		{name: "Redis 7.4.6", give: "redis_version:7.4.6\n", want: "Redis 7.4.6"},
		{name: "Redis 8.0.3", give: "redis_version:8.0.3\n", want: "Redis 8.0.3", wantWarning: true},
		{name: "Redis 8.0.4", give: "redis_version:8.0.4\n", want: "Redis 8.0.4"},
		{name: "Redis 8.1.0: a line without the fix", give: "redis_version:8.1.0\n", want: "Redis 8.1.0", wantWarning: true},
		{name: "Redis 8.2.1", give: "redis_version:8.2.1\n", want: "Redis 8.2.1", wantWarning: true},
		{name: "Redis 8.2.2", give: "redis_version:8.2.2\n", want: "Redis 8.2.2"},
		{name: "Redis 9.0.0", give: "redis_version:9.0.0\n", want: "Redis 9.0.0"},
		{name: "Redis 6.2: no Functions", give: "redis_version:6.2.14\n", want: "Redis 6.2.14", wantUnsupported: "Redis 6.2.14 has no Functions", wantWarning: true},
		// Only what is known fixed goes unwarned: a release candidate of the first line
		// born with the fixes (Redis 8.3.x before 8.4, Valkey 8.9.x before 9.0) was cut
		// before them.
		{name: "Redis 8.3.240 (an 8.4 candidate)", give: "redis_version:8.3.240\n", want: "Redis 8.3.240", wantWarning: true},
		{name: "Redis 8.4.0", give: "redis_version:8.4.0\n", want: "Redis 8.4.0"},
		{name: "Valkey 8.2.0: a line without the fix", give: "server_name:valkey\nvalkey_version:8.2.0\n", want: "Valkey 8.2.0", wantWarning: true},
		{name: "Valkey 8.9.101 (a 9.0 candidate)", give: "server_name:valkey\nvalkey_version:8.9.101\n", want: "Valkey 8.9.101", wantWarning: true},
		{name: "Valkey 10.0.0", give: "server_name:valkey\nvalkey_version:10.0.0\n", want: "Valkey 10.0.0"},
		{name: "Redis 8: missing parts are 0", give: "redis_version:8\n", want: "Redis 8", wantWarning: true},
		// A version that does not say which fixes it has is never taken for fixed.
		{name: "Valkey unstable build", give: "server_name:valkey\nvalkey_version:255.255.255\n", want: "Valkey 255.255.255", wantWarning: true, wantText: `Valkey version "255.255.255" does not tell`},
		{name: "Redis unstable build", give: "redis_version:255.255.255\n", want: "Redis 255.255.255", wantWarning: true, wantText: `Redis version "255.255.255" does not tell`},
		{name: "Valkey release candidate suffix", give: "server_name:valkey\nvalkey_version:9.0.0-rc1\n", want: "Valkey 9.0.0-rc1", wantWarning: true, wantText: `"9.0.0-rc1" does not tell`},
		{name: "Redis version with too many parts", give: "redis_version:8.2.2.1\n", want: "Redis 8.2.2.1", wantWarning: true, wantText: "does not tell"},
		{name: "Redis version not a number", give: "redis_version:x.y\n", want: "Redis x.y", wantWarning: true, wantText: "does not tell"},
		{name: "Redis version negative", give: "redis_version:8.-1.0\n", want: "Redis 8.-1.0", wantWarning: true, wantText: "does not tell"},
		{name: "another server", give: "redis_version:7.2.4\nserver_name:keydb\n", want: "keydb 7.2.4"},
		{name: "not told", give: "# Server\n", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := parseServer(tt.give)
			if s.String() != tt.want {
				t.Errorf("server %q, want %q", s, tt.want)
			}
			if got := s.unsupported(); (tt.wantUnsupported == "") != (got == "") || !strings.Contains(got, tt.wantUnsupported) {
				t.Errorf("unsupported %q, want %q", got, tt.wantUnsupported)
			}
			w := s.warnings()
			if (len(w) > 0) != tt.wantWarning {
				t.Errorf("warnings %q, want a warning %v", w, tt.wantWarning)
			}
			fixed := "Redis 7.2.11, 7.4.6, 8.0.4, 8.2.2"
			if strings.HasPrefix(tt.want, "Valkey") {
				fixed = "Valkey 7.2.11, 8.0.6, 8.1.4"
			}
			prefix := tt.want + " "
			if tt.wantText != "" {
				prefix = ""
			}
			if len(w) > 0 && (w[0].ID != WarnLuaSecurity || !strings.HasPrefix(w[0].Text, prefix) || !strings.Contains(w[0].Text, tt.wantText) || !strings.Contains(w[0].Text, fixed)) {
				t.Errorf("warning %+v does not name the server and the fixed releases (%s)", w[0], fixed)
			}
		})
	}
}
