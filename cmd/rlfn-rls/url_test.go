package main

import (
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url, want string // want: "" parses
	}{
		{"redis://127.0.0.1:6379", ""},
		{"valkeys://user:pw@cache.internal:6380/2", ""},
		{"redis://u:s3cret@h:1?bogus=1", `"redis://u:xxxxx@h:1?bogus=1": unknown parameter "bogus"`},
		{"redis://h:1/", ""},
		{"redis://h:1?dial_timeout=2s", ""},
		{"http://h:1", "the scheme must be redis, valkey, rediss or valkeys"},
		{"redis://h:1?dial_timout=2s", `unknown parameter "dial_timout"`},
		{"redis://h:1?master_set=m", `unknown parameter "master_set"`},
		{"redis://u:s3cr#t@h:1", errURLPassword},
		{"redis://u:s3cr/t@h:1", errURLPassword},
		{"redis://u:s3cr%zz@h:1", errURLPassword},
	} {
		opt, err := parseURL(tc.url)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.url, err)
		case tc.want == "" && !opt.DisableCache:
			t.Errorf("%s: client-side caching on", tc.url)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.url, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "s3cr"):
			t.Errorf("%s: the error repeats the password: %v", tc.url, err)
		}
	}
}
