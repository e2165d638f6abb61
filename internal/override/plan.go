package override

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// Op is what a Change does to the store.
type Op string

const (
	Add    Op = "add"
	Update Op = "change"
	Remove Op = "remove"
)

// Change is one override added, changed or removed: Old is nil for an Add, New for a Remove.
type Change struct {
	Op  Op        `json:"op"`
	Old *Override `json:"old,omitempty"`
	New *Override `json:"new,omitempty"`
}

// ID is the ID of the override the change is about.
func (c Change) ID() ID {
	if c.New != nil {
		return c.New.ID()
	}
	return c.Old.ID()
}

// Diff is the changes that make the overrides current into desired, in ID order: desired is
// the whole set (a file of overrides as code), so an override the server holds and desired
// does not is removed. Neither may hold one ID twice (Parse and Store.Read make sure).
func Diff(current, desired []Override) []Change {
	have := map[ID]Override{}
	for _, o := range current {
		have[o.ID()] = o
	}
	var out []Change
	for _, o := range desired {
		old, ok := have[o.ID()]
		delete(have, o.ID())
		switch {
		case !ok:
			out = append(out, Change{Op: Add, New: ptr(o)})
		case !Same(old, o):
			out = append(out, Change{Op: Update, Old: ptr(old), New: ptr(o)})
		}
	}
	for _, o := range have {
		out = append(out, Change{Op: Remove, Old: ptr(o)})
	}
	slices.SortFunc(out, func(a, b Change) int {
		switch ia, ib := a.ID(), b.ID(); {
		case ia.Less(ib):
			return -1
		case ib.Less(ia):
			return 1
		}
		return 0
	})
	return out
}

func ptr(o Override) *Override { return &o }

// Same reports whether a and b are the same override, to the millisecond the store keeps.
func Same(a, b Override) bool {
	return a.ID() == b.ID() && a.Limit == b.Limit && a.Note == b.Note &&
		a.Until.UnixMilli() == b.Until.UnixMilli() && a.Until.IsZero() == b.Until.IsZero()
}

// Set is the change that sets o, over whatever current holds under its ID.
func Set(current []Override, o Override) Change {
	for _, c := range current {
		if c.ID() == o.ID() {
			return Change{Op: Update, Old: ptr(c), New: ptr(o)}
		}
	}
	return Change{Op: Add, New: ptr(o)}
}

// File is a file of overrides as code: every override the store should hold.
type File struct {
	Overrides []Override `json:"overrides"`
}

// Parse reads a file of overrides (JSON: {"overrides": [...]}) and checks every override as
// Check does, at now, with limit; a field it does not know, or one ID twice, is an error too.
// It reports every mistake, joined, so that a file is fixed in one pass.
func Parse(r io.Reader, now time.Time, limit func(Override) error) ([]Override, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" {
			// a bare list of overrides, the likeliest slip
			return nil, fmt.Errorf(`%w: a file of overrides is one JSON object, {"overrides": [...]}, not %s`, ErrInvalid, te.Value)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: more than one JSON value", ErrInvalid)
	}
	// An empty file, {} or null would apply as "remove every override": only an explicit
	// {"overrides": []} says that.
	var probe struct {
		Overrides *json.RawMessage `json:"overrides"`
	}
	if json.Unmarshal(data, &probe) != nil || probe.Overrides == nil || string(*probe.Overrides) == "null" {
		return nil, fmt.Errorf(`%w: no "overrides" list: {"overrides": []} removes every override, say so`, ErrInvalid)
	}
	var errs []error
	seen := map[ID]int{}
	for i, o := range f.Overrides {
		if j, dup := seen[o.ID()]; dup {
			errs = append(errs, fmt.Errorf("%w: overrides %d and %d are both %s", ErrInvalid, j+1, i+1, o.ID()))
			continue
		}
		seen[o.ID()] = i
		if err := Check(o, now, limit); err != nil {
			errs = append(errs, fmt.Errorf("override %d: %w", i+1, err))
		}
	}
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	return f.Overrides, nil
}

// joinErrors is errors.Join on one line per error, "; " between: rlfn prints an error as one
// line.
func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return &multiError{errs}
}

type multiError struct{ errs []error }

func (m *multiError) Error() string {
	var b bytes.Buffer
	for i, e := range m.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

func (m *multiError) Unwrap() []error { return m.errs }
