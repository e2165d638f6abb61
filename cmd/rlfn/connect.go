package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/deployer"
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
	opt, err := parseURL(c.String("url"))
	if err != nil {
		return opt, err
	}
	// The dial and the connection's handshake (which ConnWriteTimeout bounds) both count.
	timeout := c.Duration("timeout")
	if opt.Dialer.Timeout <= 0 || opt.Dialer.Timeout > timeout {
		opt.Dialer.Timeout = timeout
	}
	if opt.ConnWriteTimeout <= 0 || opt.ConnWriteTimeout > timeout {
		opt.ConnWriteTimeout = timeout
	}
	file, from := c.String("tls-ca"), "--tls-ca"
	if file == "" && opt.TLSConfig != nil {
		file, from = os.Getenv(tlsCAEnv), "$"+tlsCAEnv
	}
	if file != "" {
		if opt.TLSConfig == nil {
			return opt, errors.New("--tls-ca needs a rediss:// or valkeys:// URL")
		}
		pem, err := os.ReadFile(file)
		if err != nil {
			return opt, fmt.Errorf("%s: %w", from, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return opt, fmt.Errorf("%s: no PEM certificate in %s", from, file)
		}
		opt.TLSConfig.RootCAs = pool
	}
	return opt, nil
}

// commandContext is the context of one command: cancelled by --timeout.
func commandContext(c *cli.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Context, c.Duration("timeout"))
}

// discover finds every node of the target named by the global flags.
func discover(ctx context.Context, c *cli.Context) (*deployer.Target, error) {
	opt, err := clientOption(c)
	if err != nil {
		return nil, err
	}
	return deployer.Discover(ctx, opt)
}
