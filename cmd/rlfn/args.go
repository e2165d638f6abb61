package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// permute moves a command's flags before its positional arguments, so that
// "rlfn call token_bucket user:42 --capacity 10" works: urfave/cli v2 stops parsing flags at
// the first positional argument, and the documented syntax puts them after ALGORITHM KEY.
// Arguments after "--" stay positional; global flags before the command are left alone.
func permute(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
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
			i++
		}
	}
	if i >= len(args) || args[i] == "--" {
		return args
	}
	cmd := app.Command(args[i])
	if cmd == nil {
		return args
	}
	out := append([]string{}, args[:i+1]...)
	var flags, positional []string
	rest := args[i+1:]
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		switch {
		case a == "--":
			positional = append(positional, rest[j+1:]...)
			j = len(rest)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			if takesValue(cmd.Flags, a) && j+1 < len(rest) {
				j++
				flags = append(flags, rest[j])
			}
		default:
			positional = append(positional, a)
		}
	}
	out = append(out, flags...)
	if len(positional) > 0 {
		// "--" keeps a positional argument that starts with "-" (a key "-1") positional.
		out = append(out, "--")
		out = append(out, positional...)
	}
	return out
}

// takesValue reports whether arg ("--name" or "-name", without "=value") names one of flags
// that takes a value; an unknown flag is treated as taking none, and cli reports it.
func takesValue(flags []cli.Flag, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if bf, ok := f.(*cli.BoolFlag); ok && bf != nil {
				return false
			}
			return true
		}
	}
	return false
}
