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
// A Remove of a field of the store that holds no override (a BadField) has neither, and
// Field set.
type Change struct {
	Op    Op        `json:"op"`
	Old   *Override `json:"old,omitempty"`
	New   *Override `json:"new,omitempty"`
	Field string    `json:"field,omitempty"`
}

// ID is the ID of the override the change is about (a bad field's: none).
func (c Change) ID() ID {
	switch {
	case c.New != nil:
		return c.New.ID()
	case c.Old != nil:
		return c.Old.ID()
	}
	return ID{}
}

// RemoveBad are the changes that remove the store's bad fields.
func RemoveBad(bad []BadField) []Change {
	out := make([]Change, 0, len(bad))
	for _, b := range bad {
		out = append(out, Change{Op: Remove, Field: b.Field})
	}
	return out
}

// Diff is the changes that make the overrides current into desired, in ID order: desired is
// the whole set (a file of overrides as code), so an override the server holds and desired
// does not is removed. Neither may hold one ID twice (Parse and Store.Read make sure). It
// sorts both (in place) and walks them side by side: O(n log n) for millions of overrides.
func Diff(current, desired []Override) []Change {
	cmp := func(a, b Override) int { return compareID(a.ID(), b.ID()) }
	if !slices.IsSortedFunc(current, cmp) {
		slices.SortFunc(current, cmp)
	}
	if !slices.IsSortedFunc(desired, cmp) {
		slices.SortFunc(desired, cmp)
	}
	var out []Change
	i, j := 0, 0
	for i < len(current) || j < len(desired) {
		switch {
		case j == len(desired) || i < len(current) && compareID(current[i].ID(), desired[j].ID()) < 0:
			out = append(out, Change{Op: Remove, Old: &current[i]})
			i++
		case i == len(current) || compareID(current[i].ID(), desired[j].ID()) > 0:
			out = append(out, Change{Op: Add, New: &desired[j]})
			j++
		default:
			if !Same(current[i], desired[j]) {
				out = append(out, Change{Op: Update, Old: &current[i], New: &desired[j]})
			}
			i++
			j++
		}
	}
	return out
}

func compareID(a, b ID) int {
	switch {
	case a.Less(b):
		return -1
	case b.Less(a):
		return 1
	}
	return 0
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
	return ParseProgress(r, now, limit, nil)
}

// ParseProgress is Parse telling progress, if set, how many of the file's overrides it has
// checked, every 10,000 and at the end: a file of a million takes seconds.
func ParseProgress(r io.Reader, now time.Time, limit func(Override) error, progress func(done, total int)) ([]Override, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	// The list is read as raw values first, each then decoded on its own: a mistake in one
	// override (a field misspelt, a string for a number) is reported with every other one.
	var f struct {
		Overrides *[]json.RawMessage `json:"overrides"`
	}
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
	if f.Overrides == nil {
		return nil, fmt.Errorf(`%w: no "overrides" list: {"overrides": []} removes every override, say so`, ErrInvalid)
	}
	var errs []error
	all := make([]Override, 0, len(*f.Overrides))
	seen := make(map[ID]int, len(*f.Overrides))
	for i, raw := range *f.Overrides {
		if progress != nil && i%10_000 == 0 {
			progress(i, len(*f.Overrides))
		}
		var o Override
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&o); err != nil {
			errs = append(errs, fmt.Errorf("override %d: %w: %v", i+1, ErrInvalid, err))
			continue
		}
		if j, dup := seen[o.ID()]; dup {
			errs = append(errs, fmt.Errorf("%w: overrides %d and %d are both %s", ErrInvalid, j+1, i+1, o.ID()))
			continue
		}
		seen[o.ID()] = i
		if err := Check(o, now, limit); err != nil {
			errs = append(errs, fmt.Errorf("override %d: %w", i+1, err))
			continue
		}
		all = append(all, o)
	}
	if progress != nil {
		progress(len(*f.Overrides), len(*f.Overrides))
	}
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	return all, nil
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
