package decide

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rlfn/rlfn/client"
)

// mine is a caller's limit type embedding one of the client's: its algorithm is the embedded
// one's.
type mine struct {
	client.TokenBucket
	Plan string
}

// Two limits on a policy's own key are one limiter when they have one algorithm and one Name:
// the configuration says so before the client would refuse the call.
func TestCheckSameKey(t *testing.T) {
	tb := client.TokenBucket{Capacity: 10, Rate: 1, Period: time.Second}
	named := tb
	named.Name = "tokens"
	fw := client.FixedWindow{Limit: 5, Window: time.Minute}
	for _, tt := range []struct {
		name  string
		limit client.Limit
		also  []Named
		bad   string // "": accepted
	}{
		{"other algorithms", tb, []Named{{Name: "b", Limit: fw, SameKey: true}}, ""},
		{"one algorithm, named", tb, []Named{{Name: "b", Limit: named, SameKey: true}}, ""},
		{"one algorithm, no name", tb, []Named{{Name: "b", Limit: tb, SameKey: true}}, "b"},
		{"a pointer is the same limiter", tb, []Named{{Name: "b", Limit: &tb, SameKey: true}}, "b"},
		{"an embedding type is its limit's", tb, []Named{{Name: "b", Limit: mine{TokenBucket: tb}, SameKey: true}}, "b"},
		{"an embedding type, named", tb, []Named{{Name: "b", Limit: mine{TokenBucket: named}, SameKey: true}}, ""},
		{"not on the same key", tb, []Named{{Name: "b", Limit: tb}}, ""},
		{"two further limits", nil, []Named{{Name: "a", Limit: fw, SameKey: true}, {Name: "b", Limit: fw, SameKey: true}}, "b"},
		{"a nil pointer is left to the client", tb, []Named{{Name: "b", Limit: (*client.TokenBucket)(nil), SameKey: true}}, ""},
	} {
		bad, reason := CheckSameKey("p", tt.limit, len(tt.also), func(i int) Named { return tt.also[i] })
		if bad != tt.bad || (bad != "") != strings.Contains(reason, "give the Limit a Name") {
			t.Errorf("%s: %q, %q; want %q", tt.name, bad, reason, tt.bad)
		}
	}
}

// A limit counted on the policy's key has no principal of its own.
func TestCheckSameKeyWithKey(t *testing.T) {
	also := []Named{{Name: "b", Limit: client.FixedWindow{Limit: 1, Window: time.Second}, SameKey: true, OwnKey: true}}
	bad, reason := Check("p", "", 0, 1, func(i int) Named { return also[i] })
	if bad != "b" || !strings.Contains(reason, "cannot have a Key of its own") {
		t.Errorf("%q, %q", bad, reason)
	}
}

// A Split puts each limit on its key: the policy's own, a further one's own name on the
// policy's principal, its Key's principal, or with SameKey the policy's key; a Key error
// refuses unless only shadow limits see it; with an outcome, which costs are estimates.
func TestSplit(t *testing.T) {
	fw := client.FixedWindow{Limit: 5, Window: time.Minute}
	errKey := errors.New("no user")
	for _, tt := range []struct {
		name      string
		also      []Named
		principal string
		shadow    bool
		enforced  string // key cost, of each enforced rule
		inShadow  string
		measured  string
		err       error
		skipped   string // the limits whose Key error only shadow limits see
	}{
		{name: "each key", principal: "bob", also: []Named{
			{Name: "own", Limit: fw},
			{Name: "same", Limit: fw, SameKey: true, HasCost: true},
			{Name: "user", Limit: fw, OwnKey: true},
		}, enforced: "[p:alice 2 own:alice 3 p:alice 4 user:bob 5]", inShadow: "[]", measured: "[false false true false]"},
		{name: "a shadow limit's key error", also: []Named{{Name: "user", Limit: fw, OwnKey: true, Shadow: true}},
			enforced: "[p:alice 2]", inShadow: "[]", measured: "[false]", skipped: "user"},
		{name: "an enforced limit's key error", also: []Named{{Name: "user", Limit: fw, OwnKey: true}}, err: errKey},
		{name: "the policy in shadow", shadow: true, also: []Named{{Name: "same", Limit: fw, SameKey: true}},
			enforced: "[]", inShadow: "[p:alice 2 p:alice 3]", measured: "[]"},
	} {
		sp := NewSplit("p", "p:alice", tt.shadow, true)
		sp.Own(fw, 2, "", false)
		var skipped []string
		var err error
		for i, rule := range tt.also {
			k, skip, kerr := sp.Key(rule, tt.principal, nil, errKey)
			if kerr != nil {
				err = kerr
				break
			}
			if skip != nil {
				skipped = append(skipped, rule.Name)
				continue
			}
			sp.Add(rule, k, int64(i+3))
		}
		keys := func(rules []client.Rule) string {
			s := make([]string, len(rules))
			for i, r := range rules {
				s[i] = fmt.Sprint(r.Key, " ", r.Cost)
			}
			return fmt.Sprint(s)
		}
		switch {
		case tt.err != nil:
			if !errors.Is(err, tt.err) {
				t.Errorf("%s: %v, want %v", tt.name, err, tt.err)
			}
		case err != nil || keys(sp.Set.Enforced) != tt.enforced || keys(sp.Set.Shadow) != tt.inShadow ||
			fmt.Sprint(sp.Measured) != tt.measured || strings.Join(skipped, " ") != tt.skipped:
			t.Errorf("%s: %v enforced %s shadow %s measured %v skipped %v", tt.name, err,
				keys(sp.Set.Enforced), keys(sp.Set.Shadow), sp.Measured, skipped)
		}
	}
}

// Metered: the limits with a Cost are settled at the measured cost, every limit when the
// policy has none; a Cost on a shadow limit alone, or on a limit left out for its key, leaves
// the enforced ones their own.
func TestSplitMetered(t *testing.T) {
	fw := client.FixedWindow{Limit: 5, Window: time.Minute}
	for _, tt := range []struct {
		name    string
		ownCost bool
		also    []Named
		want    string
	}{
		{"no cost", false, []Named{{Name: "a", Limit: fw}}, "[true true]"},
		{"the own cost", true, []Named{{Name: "a", Limit: fw}}, "[true false]"},
		{"a further cost", false, []Named{{Name: "a", Limit: fw, HasCost: true}}, "[false true]"},
		{"a shadow cost", false, []Named{{Name: "a", Limit: fw, HasCost: true, Shadow: true}}, "[false]"},
		{"a cost left out", false, []Named{{Name: "a", Limit: fw, HasCost: true, Shadow: true, OwnKey: true}}, "[false]"},
	} {
		sp := NewSplit("p", "p:alice", false, true)
		sp.Own(fw, 1, "", tt.ownCost)
		for _, rule := range tt.also {
			k, skip, err := sp.Key(rule, "", nil, errors.New("no key"))
			if err != nil || skip != nil {
				continue
			}
			sp.Add(rule, k, 1)
		}
		if got := fmt.Sprint(sp.Metered()); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}
