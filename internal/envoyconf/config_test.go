package envoyconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
	"github.com/rlfn/rlfn/internal/envoyconf/reference"
)

// The load errors of the reference's own test files (test/config/*.yaml of
// envoyproxy/ratelimit), reproduced here in our words, each with the reference's message.
func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"bad_limit_unit", `
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: foo, requests_per_unit: 5}`, "f.yaml: invalid rate limit unit 'foo'"},
		{"bad_yaml", "'''", "f.yaml: error loading config file: "},
		{"duplicate_key", `
domain: test-domain
descriptors:
  - {key: key1, value: value1}
  - {key: key1, value: value1}`, "f.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"empty_domain", "descriptors:\n", "f.yaml: config file cannot have empty domain"},
		{"empty_file", "", "f.yaml: config file cannot have empty domain"},
		{"empty_key", "domain: d\ndescriptors:\n  - value: value1\n", "f.yaml: descriptor has empty key"},
		{"misspelled_key", `
domain: d
descriptors:
  - key: key1
    ratelimit: {unit: day, requests_per_unit: 5}`, "f.yaml: config error, unknown key 'ratelimit'"},
		{"misspelled_key2", `
domain: d
descriptors:
  - key: key1
    rate_limit: {unit: day, requestsperunit: 5}`, "f.yaml: config error, unknown key 'requestsperunit'"},
		{"non_map_list", "domain: d\ndescriptors:\n  - a\n  - b\n", "f.yaml: config error, yaml file contains list of type other than map: a"},
		{"non_string_key", "0.25: d\n", "f.yaml: config error, key is not of type string: 0.25"},
		{"float_leaf", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5.5}\n", "f.yaml: error checking config"},
		{"replaces_empty", `
domain: d
descriptors:
  - key: k
    rate_limit:
      name: self
      replaces: [{name: }]
      unit: second
      requests_per_unit: 5`, "f.yaml: should not have an empty replaces entry"},
		{"replaces_self", `
domain: d
descriptors:
  - key: k
    rate_limit:
      name: self
      replaces: [{name: self}]
      unit: second
      requests_per_unit: 5`, "f.yaml: replaces should not contain name of same descriptor"},
		{"unlimited_with_unit", `
domain: d
descriptors:
  - key: foo
    rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}`, "f.yaml: should not specify rate limit unit when unlimited"},
		{"share_threshold_without_wildcard", `
domain: d
descriptors:
  - key: k
    value: v
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 25}`, "f.yaml: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'"},
		{"negative_requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n", "f.yaml: error loading config file: "},
		// rlfn's keys where they do not belong are unknown keys, as the reference says of
		// them everywhere.
		{"extension_at_descriptor", "domain: d\ndescriptors:\n  - key: k\n    algorithm: token_bucket\n", "f.yaml: config error, unknown key 'algorithm'"},
		{"extension_at_root", "domain: d\nrate_limits: []\n", "f.yaml: config error, unknown key 'rate_limits'"},
		{"unknown_algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 1}\n",
			`f.yaml: descriptor 'd.k': unknown algorithm "gcra"`},
		{"burst_on_window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {burst: 3, unit: second, requests_per_unit: 1}\n",
			"f.yaml: descriptor 'd.k': burst does not apply to algorithm fixed_window"},
		{"bad_multiplier", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit_multiplier: 0, unit: second, requests_per_unit: 1}\n",
			"f.yaml: descriptor 'd.k': unit_multiplier must be at least 1, got 0"},
		{"reserve_over_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {reserve: 6, unit: second, requests_per_unit: 5}\n",
			"f.yaml: descriptor 'd.k': client: FixedWindow.Reserve"},
		{"calendar_seconds", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: calendar, unit: second, requests_per_unit: 5}\n",
			"f.yaml: descriptor 'd.k': a calendar's unit is day, week, month or year, got second"},
		{"calendar_zone", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: calendar, unit: month, requests_per_unit: 5, time_zone: Mars/Olympus}\n",
			"f.yaml: descriptor 'd.k': "},
		{"concurrency_no_lease", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: concurrency, unit: second, requests_per_unit: 5, holder_key: id}\n",
			"f.yaml: descriptor 'd.k': a concurrency limit needs a lease"},
		{"both_forms", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    rate_limits: [{unit: hour, requests_per_unit: 50}]\n",
			"f.yaml: descriptor 'd.k' has both rate_limit and rate_limits"},
		// The reference's YAML parser refuses a quoted boolean, and any word but YAML 1.1's.
		{"quoted_bool", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: \"yes\"}\n",
			"f.yaml: error loading config file: yaml: unmarshal errors:\n  line 4: cannot unmarshal !!str `yes` into bool"},
		{"word_bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
			"f.yaml: error loading config file: yaml: unmarshal errors:\n  line 4: cannot unmarshal !!str `maybe` into bool"},
		{"zero_token_bucket", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 0}\n",
			"f.yaml: descriptor 'd.k': client: TokenBucket.Capacity"},
		{"penalty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {penalty: soon, unit: second, requests_per_unit: 5}\n",
			`f.yaml: descriptor 'd.k': penalty must be a positive duration such as 30s or 10m, got "soon"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load([]File{{Name: "f.yaml", Data: []byte(tc.yaml)}}, false)
			if err == nil {
				t.Fatalf("loaded %v, want error %q", c.Domains(), tc.want)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to start with %q", err, tc.want)
			}
		})
	}
}

func TestDuplicateDomain(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")}
	b := File{Name: "b.yaml", Data: []byte("domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n")}
	if _, err := Load([]File{a, b}, false); err == nil || err.Error() != "b.yaml: duplicate domain 'test-domain' in config file" {
		t.Fatalf("err = %v", err)
	}
	c, err := Load([]File{a, b}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Entry{{"key1", "value1"}, {"key2", "value2"}} {
		if m := c.Match("test-domain", []Entry{e}); m.Limit == nil {
			t.Errorf("merged domain: %v has no limit", e)
		}
	}
	// A key both files define is a duplicate even when merging.
	if _, err := Load([]File{a, a}, true); err == nil || !strings.Contains(err.Error(), "duplicate descriptor composite key 'test-domain.key1_value1'") {
		t.Fatalf("err = %v", err)
	}
}

// basic is the reference's basic_config.yaml, reproduced, with the wildcards, share_threshold
// and metadata of its newer test files (which its version on the module proxy lacks).
const basic = `
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
    metadata: {service: {name: s7}, tier: 2}
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 23}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: action
        rate_limit: {unit: minute, requests_per_unit: 150}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
`

func TestMatch(t *testing.T) {
	c, err := Load([]File{{Name: "basic.yaml", Data: []byte(basic)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Entry{kv[i], kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		domain    string
		entries   []Entry
		limit     uint32 // 0: no limit
		unit      Unit
		unlimited bool
		key       string
		shared    []string
	}{
		{"unknown domain", "other", e("key1", "value1"), 0, 0, false, "", nil},
		{"no limit at the first level", "test-domain", e("key1", "value1"), 0, 0, false, "", nil},
		{"key alone matches any value", "test-domain", e("key1", "value1", "subkey1", "x"), 5, Second, false, "test-domain.key1_value1.subkey1", nil},
		{"key and value first", "test-domain", e("key1", "value1", "subkey1", "subvalue1"), 10, Second, false, "test-domain.key1_value1.subkey1_subvalue1", nil},
		{"default of the first level", "test-domain", e("key2", "anything"), 20, Minute, false, "test-domain.key2", nil},
		{"override", "test-domain", e("key2", "value2"), 30, Minute, false, "test-domain.key2_value2", nil},
		{"a value with no limit whitelists", "test-domain", e("key2", "value3"), 0, 0, false, "", nil},
		{"unknown key", "test-domain", e("key9", "x"), 0, 0, false, "", nil},
		{"more entries than the path", "test-domain", e("key3", "x", "sub", "y"), 0, 0, false, "", nil},
		{"limit only at the last entry", "test-domain", e("key5", "value5", "subkey5", "subvalue5"), 25, Day, false, "test-domain.key5_value5.subkey5_subvalue5", nil},
		{"parent limit alone", "test-domain", e("key5", "value5"), 15, Day, false, "test-domain.key5_value5", nil},
		{"deeper unknown entry", "test-domain", e("key5", "value5", "subkey5", "other"), 0, 0, false, "", nil},
		{"unlimited", "test-domain", e("key6", "x"), 0, 0, true, "test-domain.key6", nil},
		{"trailing wildcard", "test-domain", e("wild", "foobar"), 21, Minute, false, "test-domain.wild_foo*", nil},
		{"trailing wildcard, empty run", "test-domain", e("wild", "foo"), 21, Minute, false, "test-domain.wild_foo*", nil},
		{"no wildcard match", "test-domain", e("wild", "fo"), 0, 0, false, "", nil},
		{"middle wildcard", "test-domain", e("midWild", "barxyzb"), 22, Minute, false, "test-domain.midWild_bar*b", nil},
		{"middle wildcard mismatch", "test-domain", e("midWild", "barxyz"), 0, 0, false, "", nil},
		{"multi wildcard", "test-domain", e("multiWild", "foo1bar2baz"), 23, Minute, false, "test-domain.multiWild_foo*bar*baz", nil},
		{"multi wildcard out of order", "test-domain", e("multiWild", "foobazbar"), 0, 0, false, "", nil},
		{"overlapping parts", "test-domain", e("multiWild", "foobarbaz"), 23, Minute, false, "test-domain.multiWild_foo*bar*baz", nil},
		{"explicit value before a wildcard", "test-domain", e("file", "test1"), 50, Minute, false, "test-domain.file_test1", nil},
		{"share_threshold", "test-domain", e("file", "test2"), 100, Minute, false, "test-domain.file_test*", []string{"test*"}},
		{"share_threshold above the limit", "test-domain", e("user", "user/7", "action", "read"), 150, Minute, false, "test-domain.user_user/*.action", []string{"user/*", ""}},
		{"share_threshold on wildcards in the middle", "test-domain", e("multiroute", "svc1ep2rpc"), 50, Minute, false, "test-domain.multiroute_svc*ep*rpc", []string{"svc*ep*rpc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := c.Match(tc.domain, tc.entries)
			switch {
			case tc.limit == 0 && !tc.unlimited:
				if m.Limit != nil {
					t.Fatalf("limit %+v, want none", m.Limit)
				}
				return
			case m.Limit == nil:
				t.Fatal("no limit")
			}
			if m.Limit.Unlimited != tc.unlimited || m.Limit.FullKey != tc.key {
				t.Fatalf("unlimited %v key %q, want %v %q", m.Limit.Unlimited, m.Limit.FullKey, tc.unlimited, tc.key)
			}
			if !tc.unlimited {
				l := m.Limit.Limits[0]
				if len(m.Limit.Limits) != 1 || l.RequestsPerUnit != tc.limit || l.Unit != tc.unit || l.Algorithm != FixedWindow {
					t.Fatalf("limits %+v, want one fixed window of %d per %s", m.Limit.Limits, tc.limit, tc.unit)
				}
				want := client.FixedWindow{Limit: int64(tc.limit), Window: tc.unit.Length()}
				if l.Client != client.Limit(want) {
					t.Fatalf("client limit %+v, want %+v", l.Client, want)
				}
			}
			if strings.Join(m.Shared, ",") != strings.Join(tc.shared, ",") {
				t.Fatalf("shared %q, want %q", m.Shared, tc.shared)
			}
		})
	}
	m := c.Match("test-domain", e("key4", "x"))
	if m.Limit.Name != "key4_rate_limit" {
		t.Errorf("name %q", m.Limit.Name)
	}
	m = c.Match("test-domain", e("key7", "x"))
	if !m.Limit.DetailedMetric || m.Limit.Metadata.Fields["service"].GetStructValue().Fields["name"].GetStringValue() != "s7" || m.Limit.Metadata.Fields["tier"].GetNumberValue() != 2 {
		t.Errorf("key7: %+v", m.Limit)
	}
}

func TestUnits(t *testing.T) {
	for name, want := range map[string]time.Duration{
		"second": time.Second, "MINUTE": time.Minute, "Hour": time.Hour, "day": 24 * time.Hour,
		"week": 7 * 24 * time.Hour, "month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
	} {
		c, err := Load([]File{{Name: "u", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + name + ", requests_per_unit: 3}\n")}}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Match("d", []Entry{{"k", "v"}}).Limit.Limits[0].Period(); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if _, err := Load([]File{{Name: "u", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 3}\n")}}, false); err == nil {
		t.Error("unit unknown loaded")
	}
}

const extended = `
domain: api
descriptors:
  - key: user
    shadow_mode: true
    quota_mode: true
    rate_limits:
      - {algorithm: token_bucket, unit: second, requests_per_unit: 5, burst: 20, reserve: 2, penalty: 1m}
      - {algorithm: sliding_window, unit: minute, unit_multiplier: 10, requests_per_unit: 500}
      - {algorithm: sliding_window, unit: hour, requests_per_unit: 2000}
      - {algorithm: leaky_bucket, unit: second, requests_per_unit: 2, burst: 4, mode: shape}
      - {algorithm: sliding_log, unit: second, requests_per_unit: 3}
      - {algorithm: calendar, unit: month, requests_per_unit: 10000, time_zone: Europe/Paris, anchor: "2026-01-15"}
  - key: conn
    rate_limit: {algorithm: concurrency, unit: second, requests_per_unit: 10, lease: 30s, holder_key: request_id, name: conns}
`

func TestExtensions(t *testing.T) {
	c, err := Load([]File{{Name: "x", Data: []byte(extended)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	rl := c.Match("api", []Entry{{"user", "42"}}).Limit
	if !rl.ShadowMode || !rl.QuotaMode || len(rl.Limits) != 6 {
		t.Fatalf("%+v", rl)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	want := []client.Limit{
		client.TokenBucket{Capacity: 20, Rate: 5, Period: time.Second, Reserve: 2, Penalty: time.Minute},
		client.SlidingWindow{Limit: 500, Window: 10 * time.Minute, Name: "1"},
		client.SlidingWindow{Limit: 2000, Window: time.Hour, Name: "2"},
		client.LeakyBucket{Capacity: 4, Rate: 2, Period: time.Second, Mode: client.Shape},
		client.SlidingLog{Limit: 3, Window: time.Second},
		client.Calendar{Limit: 10000, Period: client.Month, Anchor: time.Date(2026, 1, 15, 0, 0, 0, 0, paris)},
	}
	for i, w := range want {
		got := rl.Limits[i].Client
		if cal, ok := got.(client.Calendar); ok {
			wc := w.(client.Calendar)
			if !cal.Anchor.Equal(wc.Anchor) || cal.Anchor.Location().String() != "Europe/Paris" || cal.Limit != wc.Limit || cal.Period != wc.Period {
				t.Errorf("limit %d: %+v, want %+v", i, got, w)
			}
			continue
		}
		if got != w {
			t.Errorf("limit %d: %+v, want %+v", i, got, w)
		}
	}
	cl := c.Match("api", []Entry{{"conn", "a"}}).Limit
	if cl.Name != "conns" || cl.Limits[0].Slots == nil || *cl.Limits[0].Slots != (client.Concurrency{Limit: 10, Lease: 30 * time.Second}) || cl.Limits[0].HolderKey != "request_id" {
		t.Fatalf("%+v %+v", cl, cl.Limits[0].Slots)
	}
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"a", "a", true}, {"a", "ab", false}, {"a*", "a", true}, {"*", "", true}, {"*a", "ba", true},
		{"a*a", "a", false}, {"a*a", "aa", true}, {"a*b*c", "abc", true}, {"a*b*c", "acb", false},
		{"a*b*b", "ab", false}, {"a*b*b", "abb", true}, {"**", "x", true},
	} {
		if got := wildcardMatch(strings.Split(tc.pattern, "*"), tc.s); got != tc.want {
			t.Errorf("%q ~ %q = %v", tc.pattern, tc.s, got)
		}
	}
}

// The reference's own test files (test/config of its module at the pinned version, read from
// the module cache), each loaded alone (merge_domain_key*.yaml together), with what the
// reference makes of them.
func TestReferenceFiles(t *testing.T) {
	dir := reference.Configs(t)
	read := func(names ...string) []File {
		var fs []File
		for _, n := range names {
			data, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				t.Error(err)
			}
			fs = append(fs, File{Name: n, Data: data})
		}
		return fs
	}
	for _, tc := range []struct {
		file string
		want string // the error's start; "" loads
	}{
		{"bad_limit_unit.yaml", "bad_limit_unit.yaml: invalid rate limit unit 'foo'"},
		{"bad_yaml.yaml", "bad_yaml.yaml: error loading config file: "},
		{"basic_config.yaml", ""},
		{"duplicate_domain.yaml", ""},
		{"duplicate_key.yaml", "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"empty_domain.yaml", "empty_domain.yaml: config file cannot have empty domain"},
		{"empty_key.yaml", "empty_key.yaml: descriptor has empty key"},
		{"misspelled_key.yaml", "misspelled_key.yaml: config error, unknown key 'ratelimit'"},
		{"misspelled_key2.yaml", "misspelled_key2.yaml: config error, unknown key 'requestsperunit'"},
		{"non_map_list.yaml", "non_map_list.yaml: config error, yaml file contains list of type other than map: a"},
		{"non_string_key.yaml", "non_string_key.yaml: config error, key is not of type string: 0.25"},
		{"replaces_empty.yaml", "replaces_empty.yaml: should not have an empty replaces entry"},
		{"replaces_self.yaml", "replaces_self.yaml: replaces should not contain name of same descriptor"},
		{"shadowmode_config.yaml", ""},
		{"share_threshold.yaml", ""},
		{"unlimited_with_unit.yaml", "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited"},
		{"wildcard.yaml", ""},
	} {
		t.Run(tc.file, func(t *testing.T) {
			_, err := Load(read(tc.file), false)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	// duplicate_domain.yaml twice: the reference's TestDuplicateDomain.
	if _, err := Load(read("duplicate_domain.yaml", "duplicate_domain.yaml"), false); err == nil || err.Error() != "duplicate_domain.yaml: duplicate domain 'test-domain' in config file" {
		t.Errorf("duplicate domain: %v", err)
	}
	c, err := Load(read("merge_domain_key1.yaml", "merge_domain_key2.yaml"), true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Match("test-domain", []Entry{{"key1", "value1"}}).Limit.Limits[0].RequestsPerUnit != 10 ||
		c.Match("test-domain", []Entry{{"key2", "value2"}}).Limit.Limits[0].RequestsPerUnit != 20 {
		t.Error("merged domain")
	}
	// What the reference's tests match in its files.
	c, err = Load(read("wildcard.yaml"), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		limit   uint32
	}{
		{[]Entry{{"wild", "foo1"}}, 20}, {[]Entry{{"wild", "foo2"}}, 20}, {[]Entry{{"wild", "bar"}}, 0},
		{[]Entry{{"noWild", "foo"}}, 20}, {[]Entry{{"noWild", "foo1"}}, 0}, {[]Entry{{"noVal", "foo"}}, 20},
		{[]Entry{{"midWild", "barab"}}, 20}, {[]Entry{{"midWild", "barb"}}, 20}, {[]Entry{{"midWild", "bara"}}, 0},
		{[]Entry{{"nestedWild", "val1"}, {"wild", "goo2"}}, 20}, {[]Entry{{"nestedWild", "val1"}, {"wild", "foo2"}}, 0},
	} {
		m := c.Match("test-domain", tc.entries)
		got := uint32(0)
		if m.Limit != nil {
			got = m.Limit.Limits[0].RequestsPerUnit
		}
		if got != tc.limit {
			t.Errorf("wildcard %v: limit %d, want %d", tc.entries, got, tc.limit)
		}
	}
	c, err = Load(read("share_threshold.yaml"), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		limit   uint32
		shared  string
	}{
		{[]Entry{{"files", "files/a.txt"}}, 100, "files/*"},
		{[]Entry{{"nested", "parent"}, {"files", "nested/x"}}, 200, ",nested/*"},
		{[]Entry{{"files", "top/y"}, {"files", "nested/z"}}, 300, "top/*,nested/*"},
		{[]Entry{{"file", "test1"}}, 50, ""},
		{[]Entry{{"file", "test2"}}, 100, "test*"},
		{[]Entry{{"path", "path/a"}, {"file", "file/b"}, {"type", "t"}}, 120, "path/*,,"},
	} {
		m := c.Match("test-domain", tc.entries)
		if m.Limit == nil || m.Limit.Limits[0].RequestsPerUnit != tc.limit || strings.Join(m.Shared, ",") != tc.shared {
			t.Errorf("share_threshold %v: %+v shared %q, want %d %q", tc.entries, m.Limit, m.Shared, tc.limit, tc.shared)
		}
	}
}

// rlfn's extension files load here; the side-by-side test checks that the reference
// refuses them.
func TestExtensionFiles(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("testdata", "rlfn"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("testdata", "rlfn", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Load([]File{{Name: e.Name(), Data: data}}, false); err != nil {
			t.Errorf("%s: %v", e.Name(), err)
		}
	}
}

// What the reference's YAML parser takes that a stricter one would not: a key repeated in a
// mapping (the last one wins), YAML 1.1's booleans unquoted, a limit of 0.
func TestReferenceLeniency(t *testing.T) {
	c, err := Load([]File{{Name: "f", Data: []byte(`
domain: x
domain: d
descriptors:
  - key: a
    shadow_mode: yes
    quota_mode: Off
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: none
    rate_limit: {unit: minute}
`)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	rl := c.Match("d", []Entry{{"a", "v"}}).Limit
	if !rl.ShadowMode || rl.QuotaMode {
		t.Errorf("%+v", rl)
	}
	for _, k := range []string{"zero", "none"} {
		if l := c.Match("d", []Entry{{k, "v"}}).Limit.Limits[0]; !l.Zero || l.Client != nil || l.RequestsPerUnit != 0 {
			t.Errorf("%s: %+v", k, l)
		}
	}
}

// The release a configuration needs: what health checks every primary against.
func TestNeeds(t *testing.T) {
	for _, tc := range []struct{ give, want string }{
		{"  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n", "1.1.0"},
		{"  - key: k\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 5}\n", "1.1.0"},
		{"  - key: k\n    rate_limit: {algorithm: calendar, unit: month, requests_per_unit: 5}\n", "1.2.0"},
		{"  - key: k\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 5, penalty: 1m}\n", "1.2.0"},
		{"  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {unit: second, requests_per_unit: 5, penalty: 1m}\n", "1.2.0"},
	} {
		c, err := Load([]File{{Name: "f", Data: []byte("domain: d\ndescriptors:\n" + tc.give)}}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Needs(); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.give, got, tc.want)
		}
	}
}

// A request's limit override is refused when its period does not fit, as a configuration's
// unit_multiplier is: 3,335,999,724 days wrapped around to a window of 31 minutes.
func TestOverridePeriod(t *testing.T) {
	for _, tc := range []struct {
		unit       Unit
		multiplier int64
		ok         bool
	}{
		{Day, 3335999724, false},
		{Year, 4294967295, false},
		{Day, 365, true},
		{Minute, 0, true}, // 0 is Envoy's unset multiplier: 1
	} {
		rl, err := Override("edge", []Entry{{Key: "k", Value: "v"}}, 2, tc.unit, tc.multiplier)
		if tc.ok != (err == nil) {
			t.Errorf("%d × %s: %v", tc.multiplier, tc.unit, err)
			continue
		}
		if err != nil {
			if !strings.Contains(err.Error(), "is too long") {
				t.Errorf("%d × %s: %v", tc.multiplier, tc.unit, err)
			}
			continue
		}
		if m := max(tc.multiplier, 1); rl.Limits[0].Period() != tc.unit.Length()*time.Duration(m) {
			t.Errorf("%d × %s: period %v", tc.multiplier, tc.unit, rl.Limits[0].Period())
		}
	}
}
