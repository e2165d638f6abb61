package deployer

import (
	"context"
	"errors"
	"fmt"
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
		return nil, fmt.Errorf("connect: %w", err)
	}
	return &conn{addr: addr, c: c}, nil
}

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

// libraryCode returns the ratelimit library's code on this node, "" when it has none.
// LIBRARYNAME is a pattern (case-insensitive on Redis 7.0), so the name is matched exactly
// here: "RateLimit" or "ratelimit2" are someone else's.
func (n *conn) libraryCode(ctx context.Context) (string, error) {
	libs, err := n.c.Do(ctx, n.c.B().FunctionList().Libraryname(functions.Library).Withcode().Build()).ToArray()
	if err != nil {
		return "", fmt.Errorf("FUNCTION LIST: %w", err)
	}
	for _, lib := range libs {
		m, err := lib.AsMap()
		if err != nil {
			return "", fmt.Errorf("FUNCTION LIST: %w", err)
		}
		name, code := m["library_name"], m["library_code"]
		if s, _ := name.ToString(); s != functions.Library {
			continue
		}
		c, err := code.ToString()
		if err != nil {
			return "", fmt.Errorf("FUNCTION LIST: library_code: %w", err)
		}
		return c, nil
	}
	return "", nil
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
