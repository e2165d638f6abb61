package httplimit

import "github.com/rlfn/rlfn/internal/decide"

// The names this package's tests knew before the decision moved to internal/decide, which both
// httplimit and grpclimit import: the tests stay as they were.
var (
	appendSeconds = decide.AppendSeconds
	appendUnix    = decide.AppendUnix
	coarseNanos   = decide.CoarseNanos
	enforced      = decide.Enforced
	seconds       = decide.Seconds
	unitLeak      = decide.UnitLeak
	window        = decide.Window
)

const nameReason = decide.NameReason
