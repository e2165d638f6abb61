package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/rlfn/rlfn/internal/envoyconf"
)

// Files names the configuration: files, and directories whose every file is read, as the
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
}

// Load reads and parses the files: a *envoyconf.Error for a bad one.
func (f Files) Load() (*envoyconf.Config, error) {
	var t tree
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
		switch {
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
// done. A file that does not load leaves the configuration in use as it was: the error is
// logged (a nil log logs nothing) and counted (rlfn.rls.config.loads{result=error}). Changes are gathered for
// settle, so that an editor's or Kubernetes' several writes make one reload.
func Watch(ctx context.Context, f Files, svc *Service, m *Metrics, log *slog.Logger, settle time.Duration) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	files := map[string]bool{} // paths given as files
	dirs := map[string]bool{}  // paths given as directories
	for _, p := range f.Paths {
		dir := filepath.Clean(p)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			// A file replaced by a rename is seen through its directory.
			files[dir] = true
			dir = filepath.Dir(dir)
		} else {
			dirs[dir] = true
		}
		if err := w.Add(dir); err != nil {
			return fmt.Errorf("watching %s: %w", dir, err)
		}
	}
	// A directory holds more than the configuration (a file's neighbours, editors' swap
	// files): only a change that Load would read, or a ConfigMap's ..data swap, reloads.
	relevant := func(name string) bool {
		name = filepath.Clean(name)
		base := filepath.Base(name)
		ext := filepath.Ext(base)
		return base == "..data" || files[name] ||
			dirs[filepath.Dir(name)] && !strings.HasPrefix(base, ".") && (ext == ".yaml" || ext == ".yml")
	}
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("rls: the file watcher stopped")
			}
			if ev.Op != fsnotify.Chmod && timer == nil && relevant(ev.Name) {
				timer = time.After(settle)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("rls: the file watcher stopped")
			}
			log.Error("watching the configuration", "err", err)
		case <-timer:
			timer = nil
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
