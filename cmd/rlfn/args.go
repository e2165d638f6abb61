package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// permute moves a command's flags before its positional arguments, so that
// "rlfn call token_bucket user:42 --capacity 10" works: urfave/cli v2 stops parsing flags at
// the first positional argument, and the documented syntax puts them after ALGORITHM KEY.
// A global flag written after the command ("rlfn status --url ...") moves before it.
// Arguments after "--" stay positional.
//
// A global flag without its value is an error naming it: "rlfn deploy --url" (an empty
// $URL in a script) must not become "rlfn --url deploy", which runs no command and exits 0,
// nor "rlfn --timeout deploy" a complaint about "deploy". A global flag whose value is the
// only command name on the line ("rlfn --url deploy") is taken to be missing its value too.
func permute(app *cli.App, args []string) ([]string, error) {
	if len(args) < 2 {
		return args, nil
	}
	// Find the command: the first argument that is not a global flag or a global flag's value.
	i := 1
	for i < len(args) {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		i++
		if takesValue(app.Flags, a) {
			if i >= len(args) || (i == len(args)-1 && app.Command(args[i]) != nil) {
				return nil, needsValue(a, args[len(args)-1], app)
			}
			i++
		}
	}
	if i >= len(args) || args[i] == "--" {
		return args, nil
	}
	cmd := app.Command(args[i])
	if cmd == nil {
		return helpOrUnknown(app, args, i)
	}
	// rlfn override set ...: the subcommand's flags may follow its arguments in turn, and the
	// global flags go before the command, wherever they are written ("rlfn override --url U
	// set ..." and "rlfn override set ... --url U" alike: cli would take them for the parent
	// command's, which has none).
	top := i
	var global, flags, positional []string
	if len(cmd.Subcommands) > 0 {
		j := i + 1
		var before []string // global flags between the command and its subcommand
		for j < len(args) && isGlobal(app, cmd, args[j]) {
			before = append(before, args[j])
			j++
			if takesValue(app.Flags, args[j-1]) {
				if j >= len(args) {
					return nil, needsValue(args[j-1], args[top], app)
				}
				before = append(before, args[j])
				j++
			}
		}
		if j < len(args) {
			if sub := cmd.Command(args[j]); sub != nil {
				i, cmd, global = j, sub, before
			}
		}
	}
	rest := args[i+1:]
	dangling := false // the last argument is a flag that needs a value
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		switch {
		case a == "--":
			positional = append(positional, rest[j+1:]...)
			j = len(rest)
		case strings.HasPrefix(a, "-") && a != "-":
			dst, flagSet := &flags, cmd.Flags
			if !defines(cmd.Flags, a) && defines(app.Flags, a) {
				dst, flagSet = &global, app.Flags
			}
			*dst = append(*dst, a)
			if takesValue(flagSet, a) {
				switch {
				case j+1 < len(rest):
					j++
					*dst = append(*dst, rest[j])
				case dst == &global:
					return nil, needsValue(a, args[i], app)
				default:
					dangling = true
				}
			}
		default:
			positional = append(positional, a)
		}
	}
	out := append(append(append([]string{}, args[:top]...), global...), args[top])
	if i != top {
		out = append(out, args[i])
	}
	out = append(out, flags...)
	if dangling {
		// Left last, it is refused ("flag needs an argument"); followed by "--", it would take
		// "--" as its value (rlfn call ... --release --id would free holder "--").
		return out, nil
	}
	if len(positional) > 0 {
		// "--" keeps a positional argument that starts with "-" (a key "-1") positional.
		out = append(out, "--")
		out = append(out, positional...)
	}
	return out, nil
}

// isGlobal reports a global flag that cmd does not define itself.
func isGlobal(app *cli.App, cmd *cli.Command, a string) bool {
	return strings.HasPrefix(a, "-") && a != "-" && a != "--" && !defines(cmd.Flags, a) && defines(app.Flags, a)
}

// helpOrUnknown turns "rlfn help [COMMAND]", as many tools take it, into --help, and is
// the error for any other word where the command should be: cli's own would be "No help
// topic for 'stat'".
func helpOrUnknown(app *cli.App, args []string, i int) ([]string, error) {
	out := slices.Clip(args[:i])
	rest := args[i+1:]
	if args[i] == "help" {
		switch {
		case len(rest) == 0:
			return append(out, "--help"), nil
		case len(rest) == 1 && app.Command(rest[0]) != nil:
			return append(out, rest[0], "--help"), nil
		case len(rest) == 1:
			return nil, unknownCommand(app, rest[0])
		}
		return nil, errors.New("help takes one command (see rlfn --help)")
	}
	return nil, unknownCommand(app, args[i])
}

func unknownCommand(app *cli.App, name string) error {
	var names []string
	for _, c := range app.Commands {
		if !c.Hidden && c.Name != "help" {
			names = append(names, c.Name)
		}
	}
	return fmt.Errorf("no command %q; there are %s (see rlfn --help)", name, strings.Join(names, ", "))
}

// needsValue is the error for a global flag written without its value, in command's line.
func needsValue(flag, command string, app *cli.App) error {
	name, _, _ := strings.Cut(strings.TrimLeft(flag, "-"), "=")
	help := "rlfn --help"
	if app.Command(command) != nil {
		help = "rlfn " + command + " --help"
	}
	return fmt.Errorf("flag needs an argument: --%s (see %s)", name, help)
}

// lookup finds the flag arg ("--name", "-name" or "--name=value") names among flags.
func lookup(flags []cli.Flag, arg string) cli.Flag {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// defines reports whether arg names one of flags.
func defines(flags []cli.Flag, arg string) bool { return lookup(flags, arg) != nil }

// takesValue reports whether arg names one of flags that takes its value from the next
// argument: not a bool flag, and not written "--name=value". An unknown flag is treated as
// taking none, and cli reports it.
func takesValue(flags []cli.Flag, arg string) bool {
	if strings.Contains(arg, "=") {
		return false
	}
	f := lookup(flags, arg)
	_, isBool := f.(*cli.BoolFlag)
	return f != nil && !isBool
}

// jsonRequested reports whether args ask for --json (the last of "--json", "--json=false"
// and the like wins), and names their command. Any argument counts but a flag's value and
// what follows "--", wherever it is written: a script that wrote --json expects JSON even
// when the line holds a mistake.
func jsonRequested(app *cli.App, args []string) (cmd string, asJSON bool) {
	flags := app.Flags
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return cmd, asJSON
		case a == "-" || !strings.HasPrefix(a, "-"):
			if c := app.Command(a); cmd == "" && c != nil {
				cmd, flags = c.Name, append(slices.Clip(c.Flags), app.Flags...)
			}
		case strings.TrimLeft(a, "-") == "json":
			asJSON = true
		case strings.HasPrefix(strings.TrimLeft(a, "-"), "json="):
			_, v, _ := strings.Cut(a, "=")
			asJSON, _ = strconv.ParseBool(v)
		case takesValue(flags, a):
			i++
		}
	}
	return cmd, asJSON
}
