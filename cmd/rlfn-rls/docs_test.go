package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlfn/rlfn/internal/envoyconf"
)

// docs/envoy/envoy.yaml is a valid Envoy bootstrap: every field known to Envoy's own types,
// every typed_config resolved, Envoy's validation rules kept.
func TestDocsEnvoyConfig(t *testing.T) {
	var doc any
	data, err := os.ReadFile("../../docs/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("not an Envoy bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("Envoy would refuse it: %v", err)
	}
}

// The configuration shown in docs/envoy.md ("As the reference") loads.
func TestDocsExample(t *testing.T) {
	md, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(md), "### As the reference")
	if !ok {
		t.Fatal("no section As the reference")
	}
	_, rest, _ = strings.Cut(rest, "```yaml\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("no yaml block")
	}
	c, err := envoyconf.Load([]envoyconf.File{{Name: "docs", Data: []byte(block)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Match("edge", []envoyconf.Entry{{Key: "path", Value: "/admin/users"}}); m.Limit == nil || m.Shared[0] != "/admin*" {
		t.Fatalf("%+v", m)
	}
}

// docs/envoy/ratelimit.yaml and the ConfigMap of kubernetes.yaml load; the Deployment's
// arguments are flags rlfn-rls takes.
func TestDocsServiceConfig(t *testing.T) {
	data, err := os.ReadFile("../../docs/envoy/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := envoyconf.Load([]envoyconf.File{{Name: "ratelimit.yaml", Data: data}}, false); err != nil {
		t.Fatal(err)
	}
	k8s, err := os.ReadFile("../../docs/envoy/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(k8s)))
	var args []string
	loaded := false
	for {
		var obj struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&obj); err != nil {
			break
		}
		switch obj.Kind {
		case "ConfigMap":
			for name, text := range obj.Data {
				if _, err := envoyconf.Load([]envoyconf.File{{Name: name, Data: []byte(text)}}, false); err != nil {
					t.Fatal(err)
				}
				loaded = true
			}
		case "Deployment":
			args = obj.Spec.Template.Spec.Containers[0].Args
		}
	}
	if !loaded || len(args) == 0 {
		t.Fatalf("no ConfigMap or no Deployment's args (%v)", args)
	}
	app := newApp(os.Stderr)
	var seen *cli.Context
	app.Action = func(c *cli.Context) error { seen = c; return nil }
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "$(RLFN_URL)", "redis://valkey:6379")
	}
	if err := app.Run(append([]string{"rlfn-rls"}, args...)); err != nil || seen == nil {
		t.Fatalf("the Deployment's arguments: %v", err)
	}
	if len(seen.StringSlice("config")) != 1 || seen.Int("instances") != 3 {
		t.Fatalf("parsed %v", seen.FlagNames())
	}
}

// The quick start's curl, sent to the command serving docs/envoy/ratelimit.yaml, gets the
// response envoy.md shows, byte for byte but for the seconds until the window's end.
func TestDocsJSON(t *testing.T) {
	md, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)curl -s -XPOST 127\.0\.0\.1:8080/json \\\n  -d '([^']*)'\n([^\n]*)\n`).FindSubmatch(md)
	if m == nil {
		t.Fatal("no curl of /json in envoy.md")
	}
	body, want := m[1], string(m[2])
	url, _, _ := startStalled(t)
	h, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := h.Addr().String()
	h.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A deadline for a loaded machine: the test checks the body, not the speed.
	a := startApp(t, ctx, "--url", url, "--config", "../../docs/envoy/ratelimit.yaml", "--http", addr, "--deadline", "5s")
	resp, err := http.Post("http://"+addr+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	seconds := regexp.MustCompile(`"durationUntilReset":"\d+s"`)
	if resp.StatusCode != http.StatusOK || seconds.ReplaceAllString(string(got), "") != seconds.ReplaceAllString(want, "") {
		t.Fatalf("HTTP %d\n%s\nenvoy.md shows\n%s", resp.StatusCode, got, want)
	}
	cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("serve: %v\n%s", err, a.stderr.String())
	}
}
