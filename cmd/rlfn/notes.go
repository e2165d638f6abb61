package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// limiterNotes is the log of the Limiter rlfn calls with. rlfn says what a call did in its own
// output and exit code, so the Limiter's lines are not printed; of them, it keeps the one that
// changes what the command did: refunds a decision owed and could not make.
type limiterNotes struct {
	mu   sync.Mutex
	lost string // the first refund_lost line's message, "" for none
}

func (n *limiterNotes) Enabled(context.Context, slog.Level) bool { return true }
func (n *limiterNotes) WithAttrs([]slog.Attr) slog.Handler       { return n }
func (n *limiterNotes) WithGroup(string) slog.Handler            { return n }

func (n *limiterNotes) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "event" && a.Value.String() == "refund_lost" {
			n.mu.Lock()
			if n.lost == "" {
				n.lost = strings.TrimPrefix(r.Message, "rlfn: ")
			}
			n.mu.Unlock()
			return false
		}
		return true
	})
	return nil
}

// refundsLost is an error when the Limiter lost refunds (or still holds some it owes after
// trying once more): the decision stands, but units stay taken that it meant to give back.
func (d *dialed) refundsLost(ctx context.Context) error {
	_ = d.lim.Close(ctx) // tries the refunds it holds once more
	d.notes.mu.Lock()
	lost := d.notes.lost
	d.notes.mu.Unlock()
	switch owed := d.lim.OwedRefunds(); {
	case lost != "":
		return fmt.Errorf("the decision stands, but %s", lost)
	case owed > 0:
		return fmt.Errorf("the decision stands, but %d refunds it owed could not be made; their units stay taken until the limiters give them back by themselves", owed)
	}
	return nil
}
