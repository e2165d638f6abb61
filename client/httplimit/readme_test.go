package httplimit

import (
	"os"
	"strings"
	"testing"
)

// The README's examples of this package's features are copied verbatim from Example
// functions, which compile (and, with an Output, run) with the package's tests. (Example and
// Example_concurrency are checked with the client's.)
func TestREADMEExamples(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Example_login", "ExampleClientIP", "Example_shadow", "ExampleTransport"} {
		i := strings.Index(string(src), "\nfunc "+name+"() {\n")
		if i < 0 {
			t.Errorf("example_test.go has no func %s", name)
			continue
		}
		j := strings.Index(string(src)[i:], "\n}\n")
		body := string(src)[i+1 : i+j+3]
		if !strings.Contains(string(readme), body) {
			t.Errorf("README.md does not hold %s as it is now; copy it again:\n%s", name, body)
		}
	}
}
