package deployer

import (
	"strings"
	"testing"

	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/mock"
	"go.uber.org/mock/gomock"
)

// TestReadEngines: a server built without Lua (Valkey 9.1 can be) lists no LUA engine in
// FUNCTION STATS: unsupported, saying so. A FUNCTION STATS the node refuses (an ACL without
// +function|stats, as ACLRules) or answers in another shape tells nothing: the node is read
// as usual, never taken for one without Lua. The real servers of the integration tests all
// have Lua, so the replies are mocked here; TestACLCluster reads nodes as the deploy-only
// user, whose FUNCTION STATS is refused.
func TestReadEngines(t *testing.T) {
	lua := mock.ValkeyMap(map[string]valkey.ValkeyMessage{"libraries_count": mock.ValkeyInt64(1), "functions_count": mock.ValkeyInt64(12)})
	stats := func(engines map[string]valkey.ValkeyMessage) valkey.ValkeyResult {
		return mock.Result(mock.ValkeyMap(map[string]valkey.ValkeyMessage{
			"running_script": mock.ValkeyNil(),
			"engines":        mock.ValkeyMap(engines),
		}))
	}
	tests := []struct {
		name            string
		give            valkey.ValkeyResult // the FUNCTION STATS reply
		wantUnsupported string              // contained; "" for supported
	}{
		{name: "Lua", give: stats(map[string]valkey.ValkeyMessage{"LUA": lua})},
		{name: "Lua and another engine", give: stats(map[string]valkey.ValkeyMessage{"JS": lua, "LUA": lua})},
		{name: "no engine at all", give: stats(map[string]valkey.ValkeyMessage{}),
			wantUnsupported: "no Lua engine (FUNCTION STATS lists none): the server was built without Lua"},
		{name: "another engine only", give: stats(map[string]valkey.ValkeyMessage{"JS": lua}),
			wantUnsupported: "no Lua engine (FUNCTION STATS lists JS)"},
		{name: "refused by an ACL: unreadable, not unsupported",
			give: mock.Result(mock.ValkeyError("NOPERM User deployer has no permissions to run the 'function|stats' command"))},
		{name: "no engines field: unreadable", give: mock.Result(mock.ValkeyMap(map[string]valkey.ValkeyMessage{"running_script": mock.ValkeyNil()}))},
		{name: "not a map: unreadable", give: mock.Result(mock.ValkeyString("OK"))},
		// Over RESP2 (Redis 7.0 to a client without HELLO 3) the maps are flat arrays.
		{name: "RESP2: Lua", give: resp2Stats(mock.ValkeyString("LUA"), mock.ValkeyArray(
			mock.ValkeyString("libraries_count"), mock.ValkeyInt64(1), mock.ValkeyString("functions_count"), mock.ValkeyInt64(12)))},
		{name: "RESP2: no engine at all", give: resp2Stats(),
			wantUnsupported: "no Lua engine (FUNCTION STATS lists none)"},
		{name: "RESP2: odd engine list: unreadable", give: resp2Stats(mock.ValkeyString("LUA"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mock.NewClient(gomock.NewController(t))
			c.EXPECT().DoMulti(gomock.Any(),
				mock.Match("INFO", "server"),
				mock.Match("FUNCTION", "LIST", "LIBRARYNAME", "ratelimit", "WITHCODE"),
				mock.Match("FCALL_RO", "rl_version", "0"),
				mock.Match("FUNCTION", "STATS"),
			).Return([]valkey.ValkeyResult{
				mock.Result(mock.ValkeyString("# Server\r\nserver_name:valkey\r\nvalkey_version:9.1.0\r\n")),
				mock.Result(mock.ValkeyArray()),
				mock.Result(mock.ValkeyError("ERR Function not found")),
				tt.give,
			})
			rd, err := (&conn{addr: "127.0.0.1:7001", c: c}).read(t.Context())
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if (tt.wantUnsupported == "") != (rd.unsupported == "") || !strings.Contains(rd.unsupported, tt.wantUnsupported) {
				t.Errorf("unsupported %q, want %q", rd.unsupported, tt.wantUnsupported)
			}
			if rd.server.String() != "Valkey 9.1.0" {
				t.Errorf("server %q", rd.server)
			}
		})
	}
}

// resp2Stats is a FUNCTION STATS reply as RESP2 gives it, engines as a flat array.
func resp2Stats(engines ...valkey.ValkeyMessage) valkey.ValkeyResult {
	return mock.Result(mock.ValkeyArray(
		mock.ValkeyString("running_script"), mock.ValkeyNil(),
		mock.ValkeyString("engines"), mock.ValkeyArray(engines...)))
}
