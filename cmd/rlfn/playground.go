package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/valkey-io/valkey-go"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/playground"
)

// playgroundCommand is built afresh for each app: cli.App.Setup writes into its commands.
func playgroundCommand() *cli.Command {
	return &cli.Command{
		OnUsageError: usageErrorHandler,
		Name:         "playground",
		Usage:        "serve a page on which every limiter of the library decides, on the server --url names",
		ArgsUsage:    " ",
		Description: "Serves one page (no external asset: it works offline) whose cards call the deployed\n" +
			"library through the Go client, as a service would, on keys of their own under\n" +
			"\"" + playground.Prefix + "\": Reset deletes only those. It runs until Ctrl-C.\n" +
			"\n" +
			"It listens on loopback only, unless --allow-remote: anyone who reaches the page can\n" +
			"call the limiters (and nothing else) on the server --url names.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Usage: "serve on `HOST:PORT` (port 0: any free port, printed)", Value: "127.0.0.1:8080"},
			&cli.BoolFlag{Name: "allow-remote", Usage: "allow a --listen address that is not loopback"},
		},
		Action: playgroundAction,
	}
}

func playgroundAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError(c, "takes no arguments")
	}
	listen := c.String("listen")
	if err := checkListen(listen, c.Bool("allow-remote")); err != nil {
		return usageError(c, err.Error())
	}
	// On loopback, the page keeps refusing the Host names of other sites (DNS rebinding) even
	// with --allow-remote, which only allows what it says.
	host, _, _ := net.SplitHostPort(listen)
	remote := !isLoopback(host)
	opt, err := clientOption(c)
	if err != nil {
		return err
	}
	ctx, cancel := commandContext(c)
	defer cancel()
	// A URL naming a replica serves the page too: its cards write, so they go to its primary.
	if opt, _, err = towardPrimary(ctx, opt); err != nil {
		return err
	}
	vk, err := valkey.NewClient(opt)
	if err != nil {
		return fmt.Errorf("%s: %w", opt.InitAddress[0], err)
	}
	defer vk.Close()
	shown := redactedURL(c.String("url"))
	srv, err := playground.New(vk, playground.Options{
		Deploy:   "rlfn --url " + shellQuote(shown) + " deploy",
		Server:   shown,
		Remote:   remote,
		Deadline: min(c.Duration("timeout"), 5*time.Second),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	hs := httpServer(srv)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	fmt.Fprintf(c.App.Writer, "rlfn playground: open http://%s/ (Ctrl-C stops it)\n", ln.Addr())
	// Say at once what the page will say: the library is absent, or the server is not usable.
	// The error holds what the server answered to rl_version: printable, as every server text.
	// The Limiter's lines (a node without the library, its breaker) go where rlfn's own do.
	lim, err := client.New(vk, client.Options{Logger: slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))})
	if err != nil {
		return err
	}
	if err := lim.Check(ctx); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "rlfn playground: %s%s\n", printable(oneLine(err.Error())), deployAdvice(err))
	}

	select {
	case err := <-served:
		return err
	case <-c.Context.Done():
	}
	// A boundary scenario waits up to a window: give the page's requests a moment, not more.
	stop, cancelStop := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelStop()
	if err := hs.Shutdown(stop); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	_ = hs.Close()
	return nil
}

// httpServer serves the page. Its requests are a few hundred bytes, so a client that takes
// seconds over its headers or a minute over its body is holding a connection, not sending:
// it is cut off (with --allow-remote, anyone could). There is no write timeout: a boundary
// scenario answers after up to a minute.
func httpServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
}

// shellQuote quotes s for a POSIX shell, so that the deploy command the page shows can be
// pasted whatever the URL holds.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkListen refuses a --listen address that is not HOST:PORT, and one that is not loopback
// unless remote is allowed: the page calls the limiters of the server --url names, and a
// person who has not said so must not expose that to the network. An empty host (":8080")
// listens on every interface; a name other than localhost may resolve anywhere.
func checkListen(addr string, remote bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: want HOST:PORT, e.g. 127.0.0.1:8080", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--listen %q: port %q is not a number from 0 to 65535", addr, port)
	}
	if remote || isLoopback(host) {
		return nil
	}
	return fmt.Errorf("--listen %q is not a loopback address: anyone who reaches the page can call the limiters; use 127.0.0.1, [::1] or localhost, or add --allow-remote", addr)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redactedURL is the --url to show on the page, its password masked. It has been parsed by
// clientOption already.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the server"
	}
	return u.Redacted()
}
