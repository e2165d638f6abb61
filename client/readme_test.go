package client_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEExamples keeps the README's client examples true: each one is copied verbatim
// from an Example function, which compiles with the package's tests.
func TestREADMEExamples(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct{ file, fn string }{
		{"example_test.go", "Example"},
		{"example_test.go", "ExampleWithPolicy"},
		{"example_test.go", "ExampleLimiter_AllowAll"},
		{"example_test.go", "ExampleLimiter_AllowAll_merchantAndGlobal"},
		{"example_test.go", "ExampleLimiter_AllowAllEach"},
		{"example_test.go", "ExampleLimiter_Refund"},
		{"example_test.go", "ExampleWithTracerProvider"},
		{"example_test.go", "ExampleLimiter_Wait"},
		{"example_test.go", "ExampleWithLeasedBudgets"},
		{"httplimit/example_test.go", "Example"},
		{"httplimit/example_test.go", "Example_concurrency"},
	} {
		src, err := os.ReadFile(ex.file)
		if err != nil {
			t.Fatal(err)
		}
		body, ok := function(string(src), ex.fn)
		if !ok {
			t.Errorf("%s has no func %s", ex.file, ex.fn)
			continue
		}
		if !strings.Contains(string(readme), body) {
			t.Errorf("README.md does not hold %s's %s as it is now; copy it again:\n%s", ex.file, ex.fn, body)
		}
	}
}

// function returns the source of func name, from its opening line to its closing brace.
func function(src, name string) (string, bool) {
	i := strings.Index(src, "\nfunc "+name+"() {\n")
	if i < 0 {
		return "", false
	}
	j := strings.Index(src[i:], "\n}\n")
	if j < 0 {
		return "", false
	}
	return src[i+1 : i+j+3], true
}
