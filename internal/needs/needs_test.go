package needs

import "testing"

func TestRelease(t *testing.T) {
	for _, tt := range []struct {
		n        int
		reserved bool
		want     string
	}{
		{0, false, V10},
		{1, false, V10},
		{1, true, V11},
		{2, false, V11},
		{3, true, V11},
	} {
		if got := Release(tt.n, tt.reserved); got != tt.want {
			t.Errorf("Release(%d, %t) = %s, want %s", tt.n, tt.reserved, got, tt.want)
		}
	}
}
