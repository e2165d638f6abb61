package helm

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// rendered are the values of every rendering that succeeded, for valuesNotTried.
var rendered struct {
	sync.Mutex
	values []map[string]any
}

func recordRendered(vals map[string]any) {
	rendered.Lock()
	defer rendered.Unlock()
	rendered.values = append(rendered.values, vals)
}

// leaves are the dotted paths of values.yaml's values: every key whose value is no map, and
// the free-form maps (a ConfigMap's files, Kubernetes' objects) as one each.
func leaves(prefix string, v map[string]any) []string {
	var paths []string
	for k, c := range v {
		p := strings.TrimPrefix(prefix+"."+k, ".")
		if m, ok := c.(map[string]any); ok && !freeForm[p] {
			paths = append(paths, leaves(p, m)...)
		} else {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	return paths
}

func lookup(v map[string]any, path string) (any, bool) {
	var c any = v
	for _, k := range strings.Split(path, ".") {
		m, ok := c.(map[string]any)
		if !ok {
			return nil, false
		}
		if c, ok = m[k]; !ok {
			return nil, false
		}
	}
	return c, true
}

// same compares two values as JSON: YAML's ints and floats alike.
func same(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	var x, y any
	_ = json.Unmarshal(ja, &x)
	_ = json.Unmarshal(jb, &y)
	return reflect.DeepEqual(x, y)
}

// valuesNotTried are values.yaml's values that no rendering of the run set to anything but
// their default: a value documented and never tried by a test.
func valuesNotTried() ([]string, error) {
	raw, err := os.ReadFile("rlfn-rls/values.yaml")
	if err != nil {
		return nil, err
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		return nil, err
	}
	rendered.Lock()
	defer rendered.Unlock()
	var missing []string
	for _, path := range leaves("", defaults) {
		def, _ := lookup(defaults, path)
		tried := false
		for _, vals := range rendered.values {
			if v, ok := lookup(vals, path); ok && !same(v, def) {
				tried = true
				break
			}
		}
		if !tried {
			missing = append(missing, path)
		}
	}
	return missing, nil
}

// checkEveryValueTried runs after the tests (TestMain): when all of them ran, every value
// of values.yaml must have been rendered with another value than its default by one (which
// then checks it). A value added without a test fails the run, naming it. Under -run or
// -skip, only with RLFN_CHART_EVERY_VALUE=1.
func checkEveryValueTried(code int) int {
	if code != 0 || (flag.Lookup("test.run").Value.String() != "" && os.Getenv("RLFN_CHART_EVERY_VALUE") == "") || flag.Lookup("test.skip").Value.String() != "" {
		return code
	}
	missing, err := valuesNotTried()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	if len(missing) > 0 {
		fmt.Printf("FAIL: values.yaml's values never rendered with another value than the default by a test: %s\n", strings.Join(missing, ", "))
		return 1
	}
	return code
}
