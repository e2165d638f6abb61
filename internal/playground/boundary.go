package playground

import "fmt"

// The boundary scenario sends a burst just before a fixed window's edge and another just
// after it. Its bounds keep the request's wait short (at most about one window) and the
// margin around the edge wide enough for a burst to fit in it.
const (
	minBoundaryWindowMs = 100
	maxBoundaryWindowMs = 60000
	maxMarginUs         = 500000 // the bursts are at most 0.5s from the edge
	minLeadUs           = 50000  // time to reset the cards before the first burst
)

// boundaryPlan is when the scenario's bursts start, in server microseconds since the epoch.
type boundaryPlan struct {
	edgeUs   int64 // the fixed window's edge between the bursts
	firstUs  int64 // the burst before it
	secondUs int64 // the burst after it
}

// planBoundary finds the next edge of a fixed window of windowMs (windows are aligned to the
// Unix epoch, as the library aligns them) that leaves at least minLeadUs before the first
// burst; the bursts are a tenth of a window (at most maxMarginUs) either side of it.
func planBoundary(nowUs, windowMs int64) boundaryPlan {
	w := windowMs * 1000
	margin := min(w/10, maxMarginUs)
	edge := (nowUs/w + 1) * w
	if edge-margin-nowUs < minLeadUs {
		edge += w
	}
	return boundaryPlan{edgeUs: edge, firstUs: edge - margin, secondUs: edge + margin}
}

// checkBoundaryWindow refuses a window the scenario would wait too long for, or whose margin
// could not hold a burst.
func checkBoundaryWindow(ms int64) error {
	if ms < minBoundaryWindowMs || ms > maxBoundaryWindowMs {
		return &RequestError{Field: "params.fixed_window.windowMs", Reason: fmt.Sprintf(
			"must be from %d to %d for the boundary scenario, got %d", minBoundaryWindowMs, maxBoundaryWindowMs, ms)}
	}
	return nil
}

// boundaryLate says which burst of plan missed its side of the edge, given the server time of
// the last decision of each: the first must end before the edge, the second before the fixed
// window after it ends. "" when both kept to their side. Calls to a distant server can take
// longer than the tenth of a window the first burst has.
func boundaryLate(plan boundaryPlan, windowMs, firstLastUs, secondLastUs int64) string {
	ms := func(us int64) int64 { return (us + 999) / 1000 }
	switch {
	case firstLastUs >= plan.edgeUs:
		return fmt.Sprintf("the first burst took %dms, past the edge by %dms: the calls are too slow for a window of %dms "+
			"(the burst starts a tenth of it, at most 0.5s, before the edge); try a longer window or smaller limits",
			ms(firstLastUs-plan.firstUs), ms(firstLastUs-plan.edgeUs), windowMs)
	case secondLastUs >= plan.edgeUs+windowMs*1000:
		return fmt.Sprintf("the second burst ended %dms after the edge, past the fixed window's next one: the calls are too slow "+
			"for a window of %dms; try a longer window or smaller limits", ms(secondLastUs-plan.edgeUs), windowMs)
	}
	return ""
}
