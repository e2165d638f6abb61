package httplimit

import (
	"os"
	"strings"
	"testing"
)

// docs/http.md shows this package's examples copied verbatim from Example functions, which
// compile (and, with an Output, run) with the package's tests. The whole check of every page's
// Go, which also fails on a block that is no example, is client's TestDocsExamples; this one
// keeps a change here from passing this package's tests unnoticed.
func TestDocsExamples(t *testing.T) {
	page, err := os.ReadFile("../../docs/http.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Example", "Example_concurrency", "Example_startup", "Example_login",
		"ExampleClientIP", "Example_shadow", "ExampleTransport"} {
		i := strings.Index(string(src), "\nfunc "+name+"() {\n")
		if i < 0 {
			t.Errorf("example_test.go has no func %s", name)
			continue
		}
		j := strings.Index(string(src)[i:], "\n}\n")
		body := string(src)[i+1 : i+j+3]
		if !strings.Contains(string(page), "```go\n"+body+"```\n") &&
			!strings.Contains(string(page), "\n"+body+"```\n") {
			t.Errorf("docs/http.md does not hold %s as it is now; copy it again:\n%s", name, body)
		}
	}
}
