package rls

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/rlfn/rlfn/internal/envoyconf"
)

// Files names the configuration: files, and directories of files. A directory's *.yaml and
// *.yml files are read, not its subdirectories'; with EveryFile, its every file, as the
// reference's runtime loader reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY:
// whatever its name, as YAML, and in subdirectories too. Links are followed, to a file or to
// a directory (a Kubernetes ConfigMap item with a path in a subdirectory is a link to one);
// one back to a directory above is an error. An entry whose name starts with a dot, a file
// or a directory and all it holds, is never read: a ConfigMap volume's ..data link and the
// dot directory it leads to hold every file again (the reference reads them unless
// RUNTIME_IGNOREDOTFILES=true, and then fails on a duplicate domain). A directory's entries
// are read in name order, a subdirectory's files where its name sorts.
type Files struct {
	Paths []string
	// Merge lets several files add to one domain (the reference's MERGE_DOMAIN_CONFIG).
	Merge bool
	// EveryFile reads a directory as the reference does (the RUNTIME_* variables): every
	// file, subdirectories too. Without it, an editor's leftovers (ratelimit.yaml~,
	// #ratelimit.yaml#) and a README beside the YAML stay unread.
	EveryFile bool
}

// Load reads and parses the files: a *envoyconf.Error for a bad one.
func (f Files) Load() (*envoyconf.Config, error) {
	t := tree{every: f.EveryFile}
	for _, p := range f.Paths {
		if err := t.add(p, func(err error) error { return err }); err != nil {
			return nil, err
		}
	}
	if len(t.files) == 0 {
		return nil, fmt.Errorf("no configuration file in %s", strings.Join(f.Paths, ", "))
	}
	files := make([]envoyconf.File, 0, len(t.files))
	for _, n := range t.files {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		files = append(files, envoyconf.File{Name: n, Data: data})
	}
	return envoyconf.Load(files, f.Merge)
}

// tree is what Files reads: the files, and the directories they are read from.
type tree struct {
	every bool // Files.EveryFile
	files []string
	dirs  []string // each directory given and its subdirectories, Load's order
}

// add adds a path given: a file, or a directory's files. fail gets each entry that cannot
// be read; what it returns, add returns at once, and for nil it goes on without the entry.
func (t *tree) add(path string, fail func(error) error) error {
	st, err := os.Stat(path)
	if err != nil {
		return fail(err)
	}
	if !st.IsDir() {
		t.files = append(t.files, path)
		return nil
	}
	return t.walk(filepath.Clean(path), nil, fail)
}

// walk adds dir's files, below the directories above (their real paths, to see a loop).
func (t *tree) walk(dir string, above []string, fail func(error) error) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fail(err)
	}
	if slices.Contains(above, real) {
		return fail(fmt.Errorf("%s: a link loops back to %s", dir, real))
	}
	above = append(above, real)
	t.dirs = append(t.dirs, dir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fail(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		st, err := os.Stat(p) // through a link
		switch ext := filepath.Ext(e.Name()); {
		case !t.every && (err != nil || st.IsDir() || ext != ".yaml" && ext != ".yml"):
			// A directory's *.yaml files alone, as rlfn-rls read them before EveryFile (a
			// subdirectory's too would read an old/ copy of a domain).
			continue
		case err != nil:
			err = fail(err)
		case st.IsDir():
			err = t.walk(p, above, fail)
		case st.Mode().IsRegular():
			t.files = append(t.files, p)
		default:
			err = fail(fmt.Errorf("%s: neither a file nor a directory (%s)", p, st.Mode().Type()))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Watch reloads svc's configuration whenever a file under f's paths changes, until ctx is
// done: a file Load reads, in a subdirectory too (one created since included), a
// ConfigMap's ..data link, or a link on the way to a path given (swapped to deploy). A file that does not load leaves the configuration in use as it
// was: the error is logged (a nil log logs nothing) and counted
// (rlfn.rls.config.loads{result=error}). Changes are gathered for settle, so that an
// editor's or Kubernetes' several writes make one reload.
func Watch(ctx context.Context, f Files, svc *Service, m *Metrics, log *slog.Logger, settle time.Duration) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer fw.Close()
	w := &watcher{Watcher: fw, log: log, every: f.EveryFile, files: map[string]bool{}, given: map[string]bool{},
		fixed: map[string]bool{}, links: map[string]bool{}, real: map[string]string{}}
	for _, p := range f.Paths {
		dir := filepath.Clean(p)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			// A file replaced by a rename is seen through its directory.
			w.files[dir] = true
			dir = filepath.Dir(dir)
		} else {
			w.given[dir] = true
		}
		if err := w.add(dir, map[string]bool{}); err != nil {
			return fmt.Errorf("watching %s: %w", dir, err)
		}
		w.fixed[dir] = true
		// A link on the way to dir, swapped to deploy a new version (the reference's
		// RUNTIME_ROOT, /srv/runtime_data/current), is seen in its own directory.
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		for a := abs; filepath.Dir(a) != a; a = filepath.Dir(a) {
			if st, err := os.Lstat(a); err != nil || st.Mode()&fs.ModeSymlink == 0 {
				continue
			}
			if err := w.add(filepath.Dir(a), map[string]bool{}); err != nil {
				return fmt.Errorf("watching %s: %w", filepath.Dir(a), err)
			}
			w.fixed[filepath.Dir(a)] = true
			w.links[a] = true
		}
	}
	w.sync(f)
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("rls: the file watcher stopped")
			}
			if ev.Op == fsnotify.Chmod || !w.relevant(ev.Name) {
				continue
			}
			if ev.Has(fsnotify.Create) && isDir(ev.Name) {
				// A new directory (or a link, ..data, leading to a new version): watched
				// before its files are read, so that none written meanwhile is missed.
				w.sync(f)
			}
			if timer == nil {
				timer = time.After(settle)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("rls: the file watcher stopped")
			}
			log.Error("watching the configuration", "err", err)
		case <-timer:
			timer = nil
			w.sync(f)
			cfg, err := f.Load()
			m.ConfigLoaded(err)
			if err != nil {
				log.Error("the new configuration does not load; the previous one still applies", "err", err)
				continue
			}
			svc.SetConfig(cfg)
			log.Info("configuration reloaded", "domains", len(cfg.Domains()))
		}
	}
}

// watcher watches the directories Files reads from, and those of the files it names.
type watcher struct {
	*fsnotify.Watcher
	log   *slog.Logger
	every bool              // Files.EveryFile
	files map[string]bool   // the paths given as files
	given map[string]bool   // the paths given as directories
	fixed map[string]bool   // the directories watched from the start: given, or a file's
	tree  map[string]bool   // the directories whose files Load reads: given, and their subdirectories
	links map[string]bool   // the links on the way to a directory of fixed
	real  map[string]string // each directory watched: its real path then
}

// relevant tells whether a change to name is one to the configuration: a directory holds
// more (a file's neighbours, editors' swap files, Kubernetes' dot entries).
func (w *watcher) relevant(name string) bool {
	name = filepath.Clean(name)
	base := filepath.Base(name)
	ext := filepath.Ext(base)
	return base == "..data" || w.files[name] || w.links[name] ||
		w.tree[filepath.Dir(name)] && !strings.HasPrefix(base, ".") && (w.every || ext == ".yaml" || ext == ".yml")
}

// sync watches the directories Load now reads files from (new subdirectories, a link now
// leading elsewhere), and no longer those it does not.
func (w *watcher) sync(f Files) {
	t := tree{every: f.EveryFile}
	for _, p := range f.Paths {
		_ = t.add(p, func(error) error { return nil }) // Load says what is wrong
	}
	w.tree = map[string]bool{}
	for d := range w.given {
		w.tree[d] = true
	}
	for _, d := range t.dirs {
		w.tree[d] = true
	}
	watched := map[string]bool{}
	for _, d := range w.WatchList() {
		watched[d] = true
	}
	for _, dirs := range []map[string]bool{w.fixed, w.tree} {
		for d := range dirs {
			if err := w.add(d, watched); err != nil && !errors.Is(err, fs.ErrNotExist) {
				w.log.Warn("watching the configuration", "dir", d, "err", err)
			}
		}
	}
	for d := range watched {
		if !w.tree[d] && !w.fixed[d] {
			_ = w.Remove(d) // an error: fsnotify dropped it already, with the directory
			delete(w.real, d)
		}
	}
}

// add watches dir unless watched, where it still leads: again if a link now leads it
// elsewhere (a ConfigMap's update), or after fsnotify dropped it (it was removed).
func (w *watcher) add(dir string, watched map[string]bool) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	if watched[dir] {
		if w.real[dir] == real {
			return nil
		}
		_ = w.Remove(dir)
	}
	if err := w.Add(dir); err != nil {
		return err
	}
	watched[dir] = true
	w.real[dir] = real
	return nil
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}
