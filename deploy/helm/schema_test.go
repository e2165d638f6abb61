package helm

import (
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// freeForm are the values whose maps are not the chart's to close: a ConfigMap's files, and
// Kubernetes' own objects and string maps, which the API server checks (and these tests
// decode strictly).
var freeForm = map[string]bool{
	"config.configMap.files": true, "resources.requests": true, "resources.limits": true,
	"deployJob.resources.requests": true, "deployJob.resources.limits": true,
	"strategy": true, "affinity": true, "nodeSelector": true, "podAnnotations": true, "podLabels": true,
	"serviceMonitor.labels": true,
}

// mapPaths are the dotted paths of every map in v (values.yaml's defaults), v's own as "".
func mapPaths(prefix string, v map[string]any) []string {
	paths := []string{prefix}
	for k, c := range v {
		if m, ok := c.(map[string]any); ok {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			paths = append(paths, mapPaths(p, m)...)
		}
	}
	sort.Strings(paths)
	return paths
}

// set sets path (dotted) in vals to v, as --set would.
func set(vals map[string]any, path string, v any) {
	m := vals
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		if _, ok := m[k].(map[string]any); !ok {
			m[k] = map[string]any{}
		}
		m = m[k].(map[string]any)
	}
	m[keys[len(keys)-1]] = v
}

// values.schema.json closes every map of the chart's own: a misspelt key anywhere
// (replica: 3, image.tags, deployJob.urlsecret) fails the install, saying where, instead of
// being ignored for the default. Each map of values.yaml is tried with a key it lacks.
func TestChartSchemaClosed(t *testing.T) {
	raw, err := os.ReadFile("rlfn-rls/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	for _, path := range mapPaths("", defaults) {
		key := "misspelt"
		if path != "" {
			key = path + ".misspelt"
		}
		if freeForm[path] {
			continue // Kubernetes' to check, or any key
		}
		vals, err := parseValues(minimal)
		if err != nil {
			t.Fatal(err)
		}
		set(vals, key, "x")
		if _, err := renderValues(t, "edge", vals); err == nil || !strings.Contains(err.Error(), "'misspelt'") {
			t.Errorf("%s: %v, want the schema's refusal", key, err)
		}
	}
}

// The schema refuses what the service or Kubernetes would refuse later, or silently misread,
// naming the value; the chart refuses a URL with credentials, which belong in a Secret.
func TestChartSchemaRefuses(t *testing.T) {
	for values, want := range map[string]string{
		"fallback: open":                            "at '/fallback'",
		"headers: ietf":                             "at '/headers'",
		"readinessPath: /live":                      "at '/readinessPath'",
		"config: {source: XDS}":                     "at '/config/source'",
		"metricsPort: 8080":                         "at '/metricsPort'",
		"metricsPort: 8081":                         "at '/metricsPort'",
		"metricsPort: 70000":                        "at '/metricsPort'",
		"replicas: 0":                               "at '/replicas'",
		"deadline: 100":                             "at '/deadline'",
		`deadline: "100"`:                           "at '/deadline'",
		"serviceMonitor: {interval: 30}":            "at '/serviceMonitor/interval'",
		"url: valkey:6379":                          "at '/url'",
		"image: {pullPolicy: always}":               "at '/image/pullPolicy'",
		"deployJob: {image: {repository: ''}}":      "at '/deployJob/image/repository'",
		"urlSecret: {name: Rls_User}":               "at '/urlSecret/name'",
		"podLabels: {team: 1}":                      "at '/podLabels/team'",
		"podDisruptionBudget: {minAvailable: half}": "at '/podDisruptionBudget/minAvailable'",
		"imagePullSecrets: [registry]":              "at '/imagePullSecrets/0'",
		"deployJob: {acceptWarnings: [Lua]}":        "at '/deployJob/acceptWarnings/0'",
		"extraArgs: [1]":                            "at '/extraArgs/0'",
		"preStopSleepSeconds: -1":                   "at '/preStopSleepSeconds'",
		// Credentials in values land in the release's Secret and helm get values.
		"url: redis://rls:secret@valkey:6379":                                                                "url holds credentials",
		"url: redis://valkey:26379?master_set=m&sentinel_password=secret":                                    "url holds credentials",
		"url: rediss://default:secret@valkey:6379\nurlSecret: {name: rls-user}\ndeployJob: {enabled: false}": "url holds credentials",
	} {
		_, err := render(t, minimal+values)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", values, err, want)
		}
	}
	// What is valid stays so: a Sentinel URL, an integer tag (--set image.tag=2), a
	// percentage budget, a fractional deadline.
	for _, values := range []string{
		"url: redis://valkey:26379?master_set=mymaster",
		"image: {tag: 2}",
		"podDisruptionBudget: {minAvailable: 50%}",
		"deadline: 1.5s",
		"metricsPort: 19001",
	} {
		if _, err := render(t, minimal+values); err != nil {
			t.Errorf("%s: %v", values, err)
		}
	}
}

// The schema is JSON, draft-07 (which Helm before 3.18 reads too), and every property it
// declares is in values.yaml, with no default values.yaml lacks: the two say the same.
func TestChartSchemaMatchesValues(t *testing.T) {
	raw, err := os.ReadFile("rlfn-rls/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	if schema["$schema"] != "http://json-schema.org/draft-07/schema#" {
		t.Errorf("$schema %v", schema["$schema"])
	}
	raw, err = os.ReadFile("rlfn-rls/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, s map[string]any, v map[string]any)
	walk = func(path string, s map[string]any, v map[string]any) {
		props, _ := s["properties"].(map[string]any)
		if props == nil || freeForm[strings.TrimPrefix(path, ".")] || strings.HasSuffix(path, ".resources") {
			return // Kubernetes' ResourceRequirements: values.yaml sets some of its fields
		}
		for k, p := range props {
			if path == "" && k == "global" {
				continue // Helm's own
			}
			c, ok := v[k]
			if !ok {
				t.Errorf("the schema's %s.%s is not in values.yaml", path, k)
				continue
			}
			if m, ok := c.(map[string]any); ok {
				walk(path+"."+k, p.(map[string]any), m)
			}
		}
		for k := range v {
			if _, ok := props[k]; !ok {
				t.Errorf("values.yaml's %s.%s is not in the schema", path, k)
			}
		}
	}
	walk("", schema, defaults)
}
