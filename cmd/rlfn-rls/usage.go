package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// invalidValue is the flag package's error for a value its flag cannot parse: it says no
// more than "parse error" for a duration, an integer or a boolean.
var invalidValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// usageError is every flag error on one line with its reason, as the service's other start-up
// errors are, rather than "parse error" followed by the whole help.
func usageError(c *cli.Context, err error, _ bool) error {
	m := invalidValue.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Errorf("%w (see rlfn-rls --help)", err)
	}
	value, name := m[1], m[2]
	if v, uerr := strconv.Unquote(`"` + value + `"`); uerr == nil {
		value = v
	}
	for _, f := range c.App.Flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		switch f.(type) {
		case *cli.DurationFlag:
			why := "not a duration"
			if _, perr := time.ParseDuration(value); perr != nil {
				why = strings.TrimPrefix(perr.Error(), "time: ")
			}
			return fmt.Errorf("--%s %q: %s; write a duration with its unit, e.g. 100ms, 2s, 1m", name, value, why)
		case *cli.IntFlag:
			return fmt.Errorf("--%s %q: not a whole number", name, value)
		case *cli.BoolFlag:
			return fmt.Errorf("--%s=%q: not true or false", name, value)
		}
	}
	return fmt.Errorf("--%s %q: %s", name, value, m[3])
}
