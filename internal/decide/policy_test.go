package decide

import (
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
