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

// Files names the configuration: files, and directories whose *.yaml and *.yml files
// (not their subdirectories') are read in name order, as the reference reads
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
type Files struct {
	Paths []string
	// Merge lets several files add to one domain (the reference's MERGE_DOMAIN_CONFIG).
	Merge bool
}

// Load reads and parses the files: a *envoyconf.Error for a bad one.
func (f Files) Load() (*envoyconf.Config, error) {
	var files []envoyconf.File
	for _, p := range f.Paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		names := []string{p}
		if st.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, err
			}
			names = names[:0]
			for _, e := range entries {
				ext := filepath.Ext(e.Name())
				// Kubernetes mounts a ConfigMap through ..data links and dot-directories.
				if !strings.HasPrefix(e.Name(), ".") && (ext == ".yaml" || ext == ".yml") {
					names = append(names, filepath.Join(p, e.Name()))
				}
			}
			slices.Sort(names)
		}
		for _, n := range names {
			data, err := os.ReadFile(n)
			if err != nil {
				return nil, err
			}
			files = append(files, envoyconf.File{Name: n, Data: data})
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no configuration file in %s", strings.Join(f.Paths, ", "))
	}
	return envoyconf.Load(files, f.Merge)
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
