package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/deployer"
	"github.com/rlfn/rlfn/versions"
)

// Exit codes are a contract that scripts depend on.
const (
	exitOK      = 0
	exitError   = 1
	exitPending = 2 // diff --exit-code found changes to deploy
	exitRefused = 3 // a safety check (drift, downgrade, major change) refused; --force overrides
	// exitWarnings: status, diff or deploy did all it says, and printed warnings that no
	// --accept-warning accepted (a server missing security fixes, a lagging replica).
	exitWarnings = 4
)

// errPending is returned by diff --exit-code when a deploy would change something.
var errPending = errors.New("changes pending")

// errVersionShown ends a command line holding --version once the version is printed: exit 0,
// nothing else run.
var errVersionShown = errors.New("version shown")

// New builds the rlfn application. Its output goes to app.Writer (results) and app.ErrWriter
// (progress, prompts, errors), which the caller sets.
func New() *cli.App {
	return &cli.App{
		Name:  "rlfn",
		Usage: "deploy and call the ratelimit library of Valkey and Redis Functions",
		Description: "rlfn finds every node of a server or cluster from one URL, shows which release of\n" +
			"the ratelimit library each runs, diffs and deploys releases embedded in this binary,\n" +
			"and calls the library's functions exactly as the Go client does.",
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    "url",
				Usage:   "`URL` of any one node: redis://, valkey://, rediss:// or valkeys:// (TLS), user and password included",
				EnvVars: []string{"RLFN_URL"},
				Value:   "redis://127.0.0.1:6379",
			},
			&cli.StringFlag{
				// Not EnvVars: RLFN_TLS_CA is read by clientOption, for TLS URLs only, so that
				// an environment set up for TLS does not break a plain redis:// URL.
				Name:  "tls-ca",
				Usage: "PEM `FILE` of the CA that signed the servers' certificates (rediss:// URLs; default: $" + tlsCAEnv + ", else the system's roots)",
			},
			&cli.DurationFlag{
				Name:  "timeout",
				Usage: "give up a command, connecting included, after `DURATION`",
				Value: defaultTimeout,
			},
			acceptFlag(),
			// Not cli's own --version (App.Version), whose help would print the version, which
			// changes with every build and release.
			&cli.BoolFlag{Name: "version", Usage: "print rlfn's version and the library releases it embeds"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 { // "rlfn -- bogus": permute leaves what follows "--" alone
				return unknownCommand(c.App, c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		Commands: []*cli.Command{
			versionsCommand(),
			statusCommand(),
			diffCommand(),
			deployCommand(),
			callCommand(),
			blockCommand(),
			unblockCommand(),
			overrideCommand(),
			resetCommand(),
			inspectCommand(),
			topCommand(),
			playgroundCommand(),
			reconcileCommand(),
		},
		Before: func(c *cli.Context) error {
			// --version wherever it is written, with a command too ("rlfn deploy --yes
			// --version"), prints the version and runs nothing else: the command was not what
			// was asked for, and would have run with the flag silently ignored.
			if c.Bool("version") {
				if _, err := fmt.Fprintln(c.App.Writer, "rlfn "+binaryVersion()); err != nil {
					return err
				}
				return errVersionShown
			}
			if c.Duration("timeout") <= 0 {
				return errors.New("--timeout must be positive")
			}
			_, err := accepted(c)
			return err
		},
		HideHelpCommand: true,
		OnUsageError:    usageErrorHandler,
		// Errors are printed once, by run, as one line; the default handler would exit.
		ExitErrHandler: func(*cli.Context, error) {},
		Metadata: map[string]any{
			releasesKey: versions.Embedded(),
		},
	}
}

// binaryVersion is what rlfn --version says: the module version rlfn was built from
// ("(devel)" for a build from a work tree) and the library releases it embeds, which are
// what it deploys.
func binaryVersion() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	set := versions.Embedded()
	names := make([]string, len(set))
	for i, r := range set {
		names[i] = r.Version
	}
	return v + " (library releases " + strings.Join(names, ", ") + ")"
}

// run executes args (args[0] is the program name) and returns the exit code.
//
// The first SIGINT or SIGTERM cancels the command's context, so that a deploy in progress
// restores what it changed, releases its lock and reports; a second one ends the process at
// once, as usual.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	app := New()
	app.Reader, app.Writer, app.ErrWriter = stdin, stdout, stderr
	return runApp(ctx, app, args)
}

// runApp is run for an app that tests may have adjusted (for instance its releases).
func runApp(ctx context.Context, app *cli.App, args []string) int {
	stdout := &countWriter{w: app.Writer}
	app.Writer = stdout
	permuted, err := permute(app, args)
	if err == nil {
		args = permuted
		err = app.RunContext(ctx, args)
	}
	code := exitCode(err)
	if err == nil || errors.Is(err, errPending) || errors.Is(err, errVersionShown) {
		return code
	}
	msg := oneLine(err.Error()) + deployAdvice(err) + timedOut(app, err)
	// A script that asked for JSON reads stdout as JSON, also when the command failed before
	// printing any: it gets the error there too, rather than empty input. call's JSON Lines
	// end with it, so that a stream cut short by an error says so on stdout as well.
	if cmd, ok := jsonRequested(app, args); ok && (stdout.n == 0 || cmd == "call") {
		_ = writeJSONLine(stdout, errorJSON{Error: msg, Exit: code})
	}
	// On a terminal: a server's text in the error (its reply, an address it announced) must
	// not send it commands.
	fmt.Fprintln(app.ErrWriter, "rlfn: "+printable(msg))
	return code
}

// errorJSON is what a --json command prints on stdout when it fails before printing its
// own JSON (a node it could not reach, a usage error), and what ends call's JSON Lines when
// a call fails: the error line stderr shows, and the exit code.
type errorJSON struct {
	Error string `json:"error"`
	Exit  int    `json:"exit"`
}

// countWriter counts the bytes written through it: whether a command printed anything.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func exitCode(err error) int {
	var refused *deployer.RefusedError
	switch {
	case err == nil, errors.Is(err, errVersionShown):
		return exitOK
	case errors.Is(err, errPending):
		return exitPending
	case errors.As(err, &refused), errors.As(err, new(*refusedError)):
		return exitRefused
	case isWarnings(err):
		return exitWarnings
	}
	return exitError
}

// oneLine keeps an error to one line: scripts read the last line of stderr.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// deployAdvice is what the CLI adds to a client's error that a deploy fixes: a node has no
// ratelimit library, or one older than the call needs, or of another major version.
func deployAdvice(err error) string {
	var ve *client.VersionError
	if errors.Is(err, client.ErrNotLoaded) || errors.As(err, &ve) {
		return " (run rlfn deploy)"
	}
	return ""
}

// usageErrorHandler keeps a flag mistake to the one error line run prints on stderr: by
// default cli prints the whole help on stdout, where a script expects JSON.
func usageErrorHandler(c *cli.Context, err error, _ bool) error {
	name := "rlfn"
	flags := c.App.Flags
	if c.Command != nil && c.Command.Name != "" && c.Command.Name != c.App.Name {
		name += " " + c.Command.Name
		flags = append(slices.Clip(c.Command.Flags), flags...)
	}
	return fmt.Errorf("%w (see %s --help)", badValue(flags, err), name)
}

// invalidValue is the flag package's error for a value its flag cannot parse, which says
// no more than "parse error" for a duration, and repeats the value for a decimal.
var invalidValue = regexp.MustCompile(`^invalid value "(.*)" for flag -([^:]+): (.*)$`)

// badValue says what is wrong with a duration a flag could not parse, and how to write one;
// other errors are returned as they are (an integer flag's, a decimal, says what is wrong).
func badValue(flags []cli.Flag, err error) error {
	m := invalidValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	value, flag, why := m[1], "--"+m[2], m[3]
	if v, uerr := strconv.Unquote(`"` + value + `"`); uerr == nil {
		value = v
	}
	switch f := lookup(flags, flag).(type) {
	case *cli.GenericFlag:
		if _, ok := f.Value.(*decimal); ok {
			return fmt.Errorf("%s %s", flag, why) // e.g. --limit "0x10" is not a decimal integer
		}
	case *cli.DurationFlag:
		if why != "parse error" {
			return err
		}
		why = "not a duration"
		if _, perr := time.ParseDuration(value); perr != nil {
			why = strings.TrimPrefix(perr.Error(), "time: ")
		}
		return fmt.Errorf("%s %q: %s; write a duration with its unit, e.g. 500ms, 1s, 1m, 1h", flag, value, why)
	}
	return err
}

// releasesKey is where the app keeps the releases it deploys: the embedded ones, or a test's.
const releasesKey = "releases"

func releases(c *cli.Context) versions.Set {
	return c.App.Metadata[releasesKey].(versions.Set)
}

// isTerminal reports whether f is an interactive terminal. Tests replace it.
var isTerminal = func(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
