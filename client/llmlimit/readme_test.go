package llmlimit

import (
	"os"
	"strings"
	"testing"
)

// docs/tokens.md shows this package's example copied verbatim from example_test.go, which
// compiles with the package's tests. client's TestDocsExamples checks every page; this one
// keeps a change here from passing this package's tests unnoticed.
func TestDocsExamples(t *testing.T) {
	page, err := os.ReadFile("../../docs/tokens.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(src), "\nfunc Example() {\n")
	if i < 0 {
		t.Fatal("example_test.go has no func Example")
	}
	j := strings.Index(string(src)[i:], "\n}\n")
	body := string(src)[i+1 : i+j+3]
	if !strings.Contains(string(page), "\n"+body+"```\n") {
		t.Errorf("docs/tokens.md does not hold Example as it is now; copy it again:\n%s", body)
	}
}
