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
	}{
		{name: "Valkey 8", give: "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n", want: "Valkey 8.0.1"},
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
			if len(w) > 0 && (!strings.Contains(w[0], tt.want) || !strings.Contains(w[0], "7.2.11, 7.4.6, 8.0.4, 8.2.2")) {
				t.Errorf("warning %q does not name the server and the fixed releases", w[0])
			}
		})
	}
}
