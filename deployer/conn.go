package deployer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/functions"
)

// conn is one node's own connection: the only type here that talks to a server. Every
// command goes to exactly this node (no cluster routing, no redirects followed).
type conn struct {
	addr string
	c    valkey.Client
}

// dial connects to addr alone, with the seed's credentials and TLS settings.
func dial(opt valkey.ClientOption, addr string) (*conn, error) {
	opt.InitAddress = []string{addr}
	opt.ForceSingleClient = true
	opt.DisableCache = true
	if opt.TLSConfig != nil {
		opt.TLSConfig = opt.TLSConfig.Clone()
	}
	c, err := valkey.NewClient(opt)
	if err != nil {
		return nil, &ConnectError{Err: err}
	}
	return &conn{addr: addr, c: c}, nil
}

// ConnectError is a failure to connect to a node (the dial, the TLS handshake, AUTH), as
// opposed to a failure of a command on a connection: what the URL got wrong shows here.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return "connect: " + e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

func (n *conn) close() { n.c.Close() }

// text runs a command whose reply is text (INFO, CLUSTER NODES). Over RESP3 these are
// verbatim strings, which valkey-go hands over with their "txt:" format prefix.
func (n *conn) text(ctx context.Context, cmd valkey.Completed) (string, error) {
	s, err := n.c.Do(ctx, cmd).ToString()
	if err != nil {
		return "", err
	}
	if len(s) >= 4 && s[3] == ':' && s[:3] == "txt" {
		s = s[4:]
	}
	return s, nil
}

func (n *conn) info(ctx context.Context, section string) (string, error) {
	s, err := n.text(ctx, n.c.B().Info().Section(section).Build())
	if err != nil {
		return "", fmt.Errorf("INFO %s: %w", section, err)
	}
	return s, nil
}

func (n *conn) clusterNodes(ctx context.Context) (string, error) {
	s, err := n.text(ctx, n.c.B().ClusterNodes().Build())
	if err != nil {
		return "", fmt.Errorf("CLUSTER NODES: %w", err)
	}
	return s, nil
}

// config reads one setting with CONFIG GET.
func (n *conn) config(ctx context.Context, name string) (string, error) {
	m, err := n.c.Do(ctx, n.c.B().ConfigGet().Parameter(name).Build()).AsStrMap()
	if err != nil {
		return "", fmt.Errorf("CONFIG GET %s: %w", name, err)
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("CONFIG GET %s: not in the reply", name)
	}
	return v, nil
}

// libraryCode returns the ratelimit library's code on this node and its engine, "" when
// it has none.
func (n *conn) libraryCode(ctx context.Context) (code, engine string, err error) {
	return parseFunctionList(n.c.Do(ctx, n.functionList()))
}

func (n *conn) functionList() valkey.Completed {
	return n.c.B().FunctionList().Libraryname(functions.Library).Withcode().Build()
}

// parseFunctionList finds the ratelimit library in a FUNCTION LIST reply. LIBRARYNAME is a
// pattern (case-insensitive on Redis 7.0), so the name is matched exactly here:
// "RateLimit" or "ratelimit2" are someone else's.
func parseFunctionList(res valkey.ValkeyResult) (code, engine string, err error) {
	libs, err := res.ToArray()
	if err != nil {
		return "", "", fmt.Errorf("FUNCTION LIST: %w", err)
	}
	for _, lib := range libs {
		m, err := lib.AsMap()
		if err != nil {
			return "", "", fmt.Errorf("FUNCTION LIST: %w", err)
		}
		name, codeMsg, engineMsg := m["library_name"], m["library_code"], m["engine"]
		if s, _ := name.ToString(); s != functions.Library {
			continue
		}
		code, err := codeMsg.ToString()
		if err != nil {
			return "", "", fmt.Errorf("FUNCTION LIST: library_code: %w", err)
		}
		engine, _ := engineMsg.ToString()
		return code, engine, nil
	}
	return "", "", nil
}

// reading is what Inspect reads of one node.
type reading struct {
	server       Server
	code, engine string
	unsupported  string // why the node cannot run Functions, "" when it can as far as it answered
}

// read asks a node, in one round trip, what it is (INFO server), what library it runs
// (FUNCTION LIST), whether it has FCALL_RO (calling rl_version: "Function not found" is
// an answer too) and which engines it has (FUNCTION STATS). An unknown FUNCTION or FCALL_RO,
// or an engine list without Lua, makes the node unsupported; the error return is for a node
// that could not be read (no answer, or a refusal such as NOPERM).
func (n *conn) read(ctx context.Context) (reading, error) {
	res := n.c.DoMulti(ctx,
		n.c.B().Info().Section("server").Build(),
		n.functionList(),
		n.c.B().FcallRo().Function("rl_version").Numkeys(0).Build(),
		n.c.B().FunctionStats().Build())
	var rd reading
	info, err := res[0].ToString()
	switch {
	case err == nil:
		rd.server = parseServer(strings.TrimPrefix(info, "txt:"))
	case !refused(err):
		return reading{}, fmt.Errorf("INFO server: %w", err)
	}
	// A refused INFO (an ACL without +info) only costs the server's name and version.
	rd.code, rd.engine, err = parseFunctionList(res[1])
	switch {
	case unknownCommand(err):
		rd.code, rd.engine = "", ""
		rd.unsupported = "FUNCTION is not a command here (renamed or disabled, blocked by a managed service, or a server before Redis 7.0)"
		return rd, nil
	case err != nil:
		return reading{}, err
	}
	if err := res[2].Error(); unknownCommand(err) {
		rd.code, rd.engine = "", ""
		rd.unsupported = "FCALL_RO is not a command here (renamed or disabled, or blocked by a managed service)"
		return rd, nil
	} else if err != nil && !refused(err) {
		return reading{}, fmt.Errorf("FCALL_RO rl_version: %w", err)
	}
	if engines, ok := parseEngines(res[3]); ok && !slices.ContainsFunc(engines, luaEngine) {
		rd.code, rd.engine = "", ""
		listed := "none"
		if len(engines) > 0 {
			listed = strings.Join(engines, ", ")
		}
		rd.unsupported = "no Lua engine (FUNCTION STATS lists " + listed + "): the server was built without Lua"
	}
	return rd, nil
}

// parseEngines reads the engine names in a FUNCTION STATS reply. ok is false when the reply
// says nothing about them: refused (an ACL user without +function|stats, such as
// ACLRules's) or not the expected shape. Unreadable is not "no engine": only an engine
// list read in full can make a node unsupported.
func parseEngines(res valkey.ValkeyResult) (engines []string, ok bool) {
	stats, err := res.AsMap()
	if err != nil {
		return nil, false
	}
	msg, found := stats["engines"]
	if !found {
		return nil, false
	}
	m, err := msg.AsMap()
	if err != nil {
		return nil, false
	}
	for name := range m {
		engines = append(engines, name)
	}
	slices.Sort(engines)
	return engines, true
}

// unknownCommand reports whether err is a server's "unknown command" answer.
func unknownCommand(err error) bool {
	return err != nil && refused(err) && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

func (n *conn) load(ctx context.Context, code string) error {
	err := n.c.Do(ctx, n.c.B().FunctionLoad().Replace().FunctionCode(code).Build()).Error()
	if err != nil {
		return fmt.Errorf("FUNCTION LOAD: %w", err)
	}
	return nil
}

// deleteLibrary removes the library; a node that has none is already as wanted.
func (n *conn) deleteLibrary(ctx context.Context) error {
	err := n.c.Do(ctx, n.c.B().FunctionDelete().LibraryName(functions.Library).Build()).Error()
	if err != nil && !strings.Contains(strings.ToLower(err.Error()), "library not found") {
		return fmt.Errorf("FUNCTION DELETE: %w", err)
	}
	return nil
}

// version calls rl_version with FCALL_RO, which primaries and replicas both serve.
func (n *conn) version(ctx context.Context) (string, error) {
	v, err := n.c.Do(ctx, n.c.B().FcallRo().Function("rl_version").Numkeys(0).Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("FCALL_RO rl_version: %w", err)
	}
	return v, nil
}

// refused reports whether err is the server's answer (the command was refused and did
// nothing) rather than a lost connection or timeout, after which the command may or may
// not have run.
func refused(err error) bool {
	var ve *valkey.ValkeyError
	return errors.As(err, &ve) && !valkey.IsValkeyNil(err)
}
