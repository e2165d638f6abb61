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

// clientOption turns the global flags into the options every connection uses: the node to
// start from, its credentials and TLS.
func clientOption(c *cli.Context) (valkey.ClientOption, error) {
	opt, err := parseURL(c.String("url"))
	if err != nil {
		return opt, err
	}
	if file := c.String("tls-ca"); file != "" {
		if opt.TLSConfig == nil {
			return opt, errors.New("--tls-ca needs a rediss:// or valkeys:// URL")
		}
		pem, err := os.ReadFile(file)
		if err != nil {
			return opt, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return opt, fmt.Errorf("--tls-ca: no PEM certificate in %s", file)
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
