package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
)

// jsonFlag and toFlag are built afresh for each command, as flags record being set.
func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: "json", Usage: "print machine-readable JSON"}
}

// decimal is a flag's integer written in decimal only, as the library reads its numbers:
// "010" is ten, "0x10" an error (cli's IntFlag and Int64Flag read both as Go literals: 8
// and 16, so that --limit 010 decided with a limit of 8). Every integer flag is one, and
// --also's fields are read by parseDecimal too.
type decimal struct{ n int64 }

func (d *decimal) Set(s string) error {
	n, err := parseDecimal(s)
	if err != nil {
		return err
	}
	d.n = n
	return nil
}

func (d *decimal) String() string { return strconv.FormatInt(d.n, 10) }

// parseDecimal reads a decimal integer: a leading zero is a decimal digit like any other
// ("010" is ten, as the library's tonumber reads it), and nothing else is a number (no 0x,
// 0o, 0b, no underscores, no exponent).
func parseDecimal(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q is out of range", s)
		}
		return 0, fmt.Errorf("%q is not a decimal integer", s)
	}
	return n, nil
}

// decimalFlag is an integer flag read by parseDecimal.
func decimalFlag(name, usage string, value int64) *cli.GenericFlag {
	return &cli.GenericFlag{Name: name, Usage: usage, Value: &decimal{n: value}}
}

// decimalValue is the value of a decimalFlag.
func decimalValue(c *cli.Context, name string) int64 { return c.Generic(name).(*decimal).n }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeJSONLine writes v as one line: --repeat prints one object per call (JSON Lines).
func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// usageError is a mistake in the command line: it names the command.
func usageError(c *cli.Context, msg string) error {
	return fmt.Errorf("%s: %s (see rlfn %s --help)", c.Command.Name, msg, c.Command.Name)
}

// table writes aligned columns; human output only, JSON is for scripts.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// columns writes aligned rows one at a time in widths fixed beforehand: unlike table, which
// aligns rows it holds until flushed, it holds none, so rows without end (call --repeat) print
// as they are made in bounded memory. A cell wider than its column pushes the rest of its row
// right, two spaces on; the last column is not padded.
type columns struct {
	w      io.Writer
	header []string
	widths []int
	line   []byte // reused for each row
}

// newColumns prints header above the first row; each column is as wide as its widest of
// widths and its header.
func newColumns(w io.Writer, widths []int, header ...string) *columns {
	c := &columns{w: w, header: header, widths: make([]int, len(header))}
	for i, h := range header {
		c.widths[i] = len(h)
		if i < len(widths) {
			c.widths[i] = max(c.widths[i], widths[i])
		}
	}
	return c
}

// row writes one row, and the header before the first.
func (c *columns) row(cells ...string) error {
	if c.header != nil {
		header := c.header
		c.header = nil
		if err := c.row(header...); err != nil {
			return err
		}
	}
	c.line = c.line[:0]
	for i, cell := range cells {
		c.line = append(c.line, cell...)
		if i == len(cells)-1 {
			break
		}
		pad := 2
		if i < len(c.widths) {
			pad = max(2, c.widths[i]+2-len(cell))
		}
		for range pad {
			c.line = append(c.line, ' ')
		}
	}
	c.line = append(c.line, '\n')
	_, err := c.w.Write(c.line)
	return err
}

// palette colours human output on a terminal, unless NO_COLOR is set (https://no-color.org).
type palette struct{ on bool }

func colours(w io.Writer) palette {
	_, noColor := os.LookupEnv("NO_COLOR")
	return palette{on: !noColor && os.Getenv("TERM") != "dumb" && isTerminal(w)}
}

func (p palette) paint(code, s string) string {
	if !p.on || s == "" {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (p palette) red(s string) string    { return p.paint("31", s) }
func (p palette) green(s string) string  { return p.paint("32", s) }
func (p palette) yellow(s string) string { return p.paint("33", s) }
func (p palette) cyan(s string) string   { return p.paint("36", s) }
func (p palette) bold(s string) string   { return p.paint("1", s) }

// printable is s for a table cell or a line for people: as it is when every rune prints,
// Go-quoted when one does not (a newline, a tab, an escape sequence, invalid UTF-8), so that
// a hostile key, or a server's text (an address it announces, its version, its errors, the
// code it runs), can neither break the table's rows nor send the terminal commands. Every
// such string goes through it; --json keeps the text as it is (escaped as JSON escapes it;
// only invalid UTF-8, which a JSON string cannot hold, becomes U+FFFD there).
func printable(s string) string {
	if prints(s, false) {
		return s
	}
	return strconv.Quote(s)
}

// prints reports whether every rune of s prints, tabs too when tabs (a line of code).
func prints(s string, tabs bool) bool {
	for _, r := range s {
		if (r == utf8.RuneError || !unicode.IsPrint(r)) && (!tabs || r != '\t') {
			return false
		}
	}
	return true
}
