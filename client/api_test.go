package client_test

import (
	"flag"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update", false, "rewrite testdata/api.golden")

// TestAPI: the package's exported names (types, functions, methods, constants, variables;
// not fields) are the ones in testdata/api.golden, so that a new public name is a decision
// made in review (rewrite it with -update), never a side effect. What only the CLI or
// rlfn-rls needs lives in internal/ instead.
func TestAPI(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/rlfn/rlfn/client")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	values := func(vs []*doc.Value, kind string) {
		for _, v := range vs {
			for _, n := range v.Names {
				if ast.IsExported(n) {
					names = append(names, kind+" "+n)
				}
			}
		}
	}
	values(p.Consts, "const")
	values(p.Vars, "var")
	for _, f := range p.Funcs {
		names = append(names, "func "+f.Name)
	}
	for _, ty := range p.Types {
		names = append(names, "type "+ty.Name)
		values(ty.Consts, "const")
		values(ty.Vars, "var")
		for _, f := range ty.Funcs {
			names = append(names, "func "+f.Name)
		}
		for _, m := range ty.Methods {
			names = append(names, "method ("+ty.Name+") "+m.Name)
		}
	}
	sort.Strings(names)
	got := strings.Join(names, "\n") + "\n"
	if *updateAPI {
		if err := os.WriteFile("testdata/api.golden", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile("testdata/api.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the exported names changed (go test -run TestAPI -update once decided):\n got:\n%s\nwant:\n%s", got, want)
	}
}
