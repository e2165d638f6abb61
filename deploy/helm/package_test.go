package helm

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// helm lint's checks, by Helm's own code (no helm binary here): Chart.yaml, the values and
// the templates, with the defaults and with every option; nothing said but INFO.
func TestChartLint(t *testing.T) {
	for name, values := range map[string]string{"defaults": minimal, "every option": everyOption} {
		m, err := parseValues(values)
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range lint.All("rlfn-rls", m, "rl", false).Messages {
			if msg.Severity > support.InfoSev {
				t.Errorf("%s: %s", name, msg)
			}
		}
	}
}

// ociComponent and ociTag are the OCI distribution specification's grammar of a repository
// path component and of a tag: helm push pushes a chart to oci://REGISTRY/PATH/<name>:<version>
// (its version's "+" written "_").
var (
	ociComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)
	ociTag       = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
)

// helm package makes the archive helm push takes: it packages, loads back with the chart's
// files and none that .helmignore leaves out, and its name and version make an OCI reference.
func TestChartPackage(t *testing.T) {
	dir := t.TempDir()
	// A file the archive must not carry, in a copy of the chart.
	src := filepath.Join(dir, "src", "rlfn-rls")
	if err := os.CopyFS(src, os.DirFS("rlfn-rls")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "values.yaml.orig"), []byte("stale: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := action.NewPackage()
	p.Destination = dir
	archive, err := p.Run(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	chrt, err := loader.Load(archive)
	if err != nil {
		t.Fatal(err)
	}
	md := chrt.Metadata
	if filepath.Base(archive) != md.Name+"-"+md.Version+".tgz" {
		t.Errorf("archive %s for %s %s", archive, md.Name, md.Version)
	}
	if _, err := semver.StrictNewVersion(md.Version); err != nil {
		t.Errorf("version %q: %v", md.Version, err)
	}
	if !ociComponent.MatchString(md.Name) || !ociTag.MatchString(strings.ReplaceAll(md.Version, "+", "_")) {
		t.Errorf("%s:%s is no OCI repository and tag", md.Name, md.Version)
	}
	var names []string
	for _, f := range chrt.Raw {
		names = append(names, f.Name)
	}
	all := strings.Join(names, " ")
	for _, want := range []string{"Chart.yaml", "values.yaml", "templates/deployment.yaml", "templates/deploy-job.yaml", "templates/_helpers.tpl"} {
		if !strings.Contains(all, want) {
			t.Errorf("the archive lacks %s: %s", want, all)
		}
	}
	if strings.Contains(all, ".orig") {
		t.Errorf("the archive holds what .helmignore leaves out: %s", all)
	}
}
