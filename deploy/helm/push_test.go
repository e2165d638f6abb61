package helm

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	helmregistry "helm.sh/helm/v3/pkg/registry"
)

// startRegistry serves an OCI registry (the distribution project's, which Helm's own tests
// use) from memory on loopback until the test ends, and returns its host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	config := &configuration.Configuration{}
	config.HTTP.Addr = addr
	config.HTTP.DrainTimeout = time.Second
	config.Storage = configuration.Storage{"inmemory": configuration.Parameters{}}
	config.Log.AccessLog.Disabled = true
	config.Log.Level = "error"
	ctx, cancel := context.WithCancel(context.Background())
	reg, err := registry.NewRegistry(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = reg.ListenAndServe()
	}()
	t.Cleanup(func() {
		_ = reg.Shutdown(context.Background())
		cancel()
		<-done
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registry never answered on %s", addr)
		}
	}
}

// What the docs say to do, done with Helm's own code against a registry on loopback: helm
// package, helm push to oci://.../charts, helm pull of oci://.../charts/rlfn-rls --version,
// and the pulled chart is the packaged one.
func TestChartPushOCI(t *testing.T) {
	host := startRegistry(t)
	dir := t.TempDir()
	p := action.NewPackage()
	p.Destination = dir
	archive, err := p.Run("rlfn-rls", nil)
	if err != nil {
		t.Fatal(err)
	}
	client, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(dir, "registry.json")))
	if err != nil {
		t.Fatal(err)
	}
	settings := cli.New()
	push := action.NewPushWithOpts(action.WithPushConfig(&action.Configuration{RegistryClient: client}), action.WithPlainHTTP(true), action.WithPushOptWriter(io.Discard))
	push.Settings = settings
	if _, err := push.Run(archive, "oci://"+host+"/charts"); err != nil {
		t.Fatalf("helm push: %v", err)
	}

	packaged, err := loader.Load(archive)
	if err != nil {
		t.Fatal(err)
	}
	pulled := filepath.Join(dir, "pulled")
	if err := os.Mkdir(pulled, 0o755); err != nil {
		t.Fatal(err)
	}
	pull := action.NewPullWithOpts(action.WithConfig(&action.Configuration{RegistryClient: client}))
	pull.Settings = settings
	pull.DestDir = pulled
	pull.Version = packaged.Metadata.Version
	pull.PlainHTTP = true
	if _, err := pull.Run("oci://" + host + "/charts/" + packaged.Metadata.Name); err != nil {
		t.Fatalf("helm pull: %v", err)
	}
	got, err := loader.Load(filepath.Join(pulled, filepath.Base(archive)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Metadata.Name != packaged.Metadata.Name || got.Metadata.Version != packaged.Metadata.Version || len(got.Raw) != len(packaged.Raw) {
		t.Fatalf("pulled %s %s (%d files), pushed %s %s (%d files)", got.Metadata.Name, got.Metadata.Version, len(got.Raw),
			packaged.Metadata.Name, packaged.Metadata.Version, len(packaged.Raw))
	}
	for i, f := range got.Raw {
		if f.Name != packaged.Raw[i].Name || string(f.Data) != string(packaged.Raw[i].Data) {
			t.Errorf("%s differs after the round trip", f.Name)
		}
	}
}
