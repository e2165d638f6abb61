package main

import (
	"strings"
	"testing"
)

// TestParseDecimal: every integer of the command line is read in decimal, as the library
// reads its numbers; Go's literals (010 as eight, 0x10) are not.
func TestParseDecimal(t *testing.T) {
	for _, tt := range []struct {
		give    string
		want    int64
		wantErr string
	}{
		{give: "10", want: 10},
		{give: "010", want: 10},
		{give: "0010", want: 10},
		{give: "08", want: 8},
		{give: "0", want: 0},
		{give: "+5", want: 5},
		{give: "-1", want: -1},
		{give: "999999999999999", want: 999999999999999},
		{give: "0x10", wantErr: `"0x10" is not a decimal integer`},
		{give: "0o10", wantErr: `"0o10" is not a decimal integer`},
		{give: "0b10", wantErr: `"0b10" is not a decimal integer`},
		{give: "1_000", wantErr: `"1_000" is not a decimal integer`},
		{give: "1e3", wantErr: `"1e3" is not a decimal integer`},
		{give: "1.0", wantErr: `"1.0" is not a decimal integer`},
		{give: " 1", wantErr: `" 1" is not a decimal integer`},
		{give: "", wantErr: `"" is not a decimal integer`},
		{give: "9223372036854775808", wantErr: `"9223372036854775808" is out of range`},
	} {
		got, err := parseDecimal(tt.give)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("parseDecimal(%q) = %d, %v; want error %q", tt.give, got, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("parseDecimal(%q) = %d, %v; want %d", tt.give, got, err, tt.want)
		}
	}
}
