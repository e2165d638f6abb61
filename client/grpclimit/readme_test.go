package grpclimit

import (
	"os"
	"strings"
	"testing"
)

// docs/grpc.md shows this package's examples copied verbatim from Example functions, which
// compile (and, with an Output, run) with the package's tests: a change here fails until the
// page is copied again.
func TestDocsExamples(t *testing.T) {
	page, err := os.ReadFile("../../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Example", "Example_refusal", "ExampleNewClient", "Example_login", "Example_tokens"} {
		i := strings.Index(string(src), "\nfunc "+name+"() {\n")
		if i < 0 {
			t.Errorf("example_test.go has no func %s", name)
			continue
		}
		j := strings.Index(string(src)[i:], "\n}\n")
		body := string(src)[i+1 : i+j+3]
		if !strings.Contains(string(page), "\n"+body+"```\n") {
			t.Errorf("docs/grpc.md does not hold %s as it is now; copy it again:\n%s", name, body)
		}
	}
}
