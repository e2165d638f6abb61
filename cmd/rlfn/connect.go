package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/internal/serverurl"
)

// defaultTimeout bounds a whole command; a deploy's verify step has its own, shorter timeout.
const defaultTimeout = 2 * time.Minute

// tlsCAEnv names the CA file for TLS URLs when --tls-ca does not.
const tlsCAEnv = "RLFN_TLS_CA"

// clientOption turns the global flags into the options every connection uses: the node to
// start from, its credentials and TLS, and a dial timeout no longer than --timeout (a node
// that does not answer must not hold a command past it). --tls-ca with a plain URL is a
// mistake; $RLFN_TLS_CA with one is not (it serves the TLS URLs of the same environment).
func clientOption(c *cli.Context) (valkey.ClientOption, error) {
	opt, err := serverurl.Parse(c.String("url"))
	if err != nil {
		return opt, err
	}
	// The dial (the Sentinels' too) and the connection's handshake (which ConnWriteTimeout
	// bounds) both count.
	timeout := c.Duration("timeout")
	serverurl.BoundConnect(&opt, timeout)
	if opt.ConnWriteTimeout <= 0 || opt.ConnWriteTimeout > timeout {
		opt.ConnWriteTimeout = timeout
	}
	file, from := c.String("tls-ca"), "--tls-ca"
	if file == "" && opt.TLSConfig != nil {
		file, from = os.Getenv(tlsCAEnv), "$"+tlsCAEnv
	}
	if file != "" {
		if err := serverurl.TrustCA(&opt, file, from); err != nil {
			return opt, err
		}
	}
	if set := opt.Sentinel.MasterSet; set != "" {
		// The commands talk to nodes one by one: to the primary the Sentinels name now.
		ctx, cancel := context.WithTimeout(c.Context, timeout)
		defer cancel()
		if opt, err = serverurl.Primary(ctx, opt); err != nil {
			return opt, fmt.Errorf("the Sentinels name no primary for %q: %w", set, err)
		}
	}
	return opt, nil
}

// commandContext is the context of one command: cancelled by --timeout. Its deadline is kept
// in the app's metadata, so that an error it caused can say so (see timedOut).
func commandContext(c *cli.Context) (context.Context, context.CancelFunc) {
	d := c.Duration("timeout")
	c.App.Metadata[deadlineKey] = commandDeadline{timeout: d, at: time.Now().Add(d)}
	return context.WithTimeout(c.Context, d)
}

// deadlineKey is where commandContext keeps the last deadline it set.
const deadlineKey = "deadline"

type commandDeadline struct {
	timeout time.Duration
	at      time.Time
}

// timedOut says, for an error that is a deadline, when it is --timeout's: "context deadline
// exceeded" alone does not tell a person which of the command's limits ran out, nor what to
// change. "" for any other error (a verification that ran out of --verify-timeout says so
// itself, before the command's deadline).
func timedOut(app *cli.App, err error) string {
	d, ok := app.Metadata[deadlineKey].(commandDeadline)
	if !ok || !errors.Is(err, context.DeadlineExceeded) || time.Now().Before(d.at) {
		return ""
	}
	return fmt.Sprintf(" (--timeout %s ran out: raise it)", d.timeout)
}

// discover finds every node of the target named by the global flags.
func discover(ctx context.Context, c *cli.Context) (*deployer.Target, error) {
	opt, err := clientOption(c)
	if err != nil {
		return nil, err
	}
	t, err := deployer.Discover(ctx, opt)
	return t, connectHint(opt, err)
}

// connectHint adds to a failure to reach the node a URL names what is most likely wrong
// when it is the URL's: TLS spoken to a plain port waits for a handshake that never comes
// (the server takes it for an unfinished command), plain text sent to a TLS port is cut
// off, and a certificate the system does not know needs its CA.
// Only a failure to connect gets one: a timeout or an EOF on a connection made says nothing
// of the URL.
func connectHint(opt valkey.ClientOption, err error) error {
	var unknownCA x509.UnknownAuthorityError
	var connecting *deployer.ConnectError
	switch {
	case err == nil || !errors.As(err, &connecting):
		return err
	case unknownReply.MatchString(err.Error()):
		return fmt.Errorf("%w (%s)", err, notServer(err.Error()))
	case opt.TLSConfig != nil && errors.As(err, &unknownCA):
		return fmt.Errorf("%w (name the CA that signed it with --tls-ca or $%s)", err, tlsCAEnv)
	case opt.TLSConfig != nil && errors.Is(err, context.DeadlineExceeded):
		// Not wrapped (%v): a longer --timeout would not help, and timedOut must not say so.
		return fmt.Errorf("%v (no answer to the TLS handshake within --timeout: is it a TLS port? rediss:// and valkeys:// need one, redis:// is plain)", err)
	case opt.TLSConfig == nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)):
		return fmt.Errorf("%w (the server hung up: does the port need TLS? then use rediss://)", err)
	}
	return err
}

// unknownReply is valkey-go's error for a reply whose first byte is no RESP type: whatever
// answered the handshake is not a Valkey or Redis server.
var unknownReply = regexp.MustCompile(`received unknown message type: (\d+)`)

// notServer says what most likely answered, from the first byte of its reply (valkey-go
// gives its code): "received unknown message type: 72" alone sends people looking for a
// protocol bug, when the URL names an HTTP port.
func notServer(msg string) string {
	code, _ := strconv.Atoi(unknownReply.FindStringSubmatch(msg)[1])
	first := fmt.Sprintf("%q", rune(code))
	switch code {
	case 'H', '<': // "HTTP/1.1 400 Bad Request", or a page of HTML
		return "not a Valkey or Redis server: an HTTP server answered (its reply starts with " + first + "); is the URL's port the server's?"
	}
	return "not a Valkey or Redis server: its reply starts with " + first + ", which is no RESP reply; is the URL's port the server's?"
}
