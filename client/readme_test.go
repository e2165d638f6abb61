package client_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The Go in README.md and docs/*.md is kept true here: every ```go block of a page is the
// source of an Example function (alone, or with the comment right above it) of this
// package's tests or httplimit's, which compile with them, or one of the fragments listed
// below. A changed example, a block edited by hand, or a page that drops an example it must
// show fails TestDocsExamples.

// exampleFiles hold the Example functions the pages may copy, relative to client/.
var exampleFiles = []string{"example_test.go", "docs_test.go", "httplimit/example_test.go", "grpclimit/example_test.go", "llmlimit/example_test.go"}

// required lists the examples each page must show, as file:function.
var required = map[string][]string{
	"README.md": {"example_test.go:Example", "httplimit/example_test.go:Example"},
	"docs/client.md": {
		"example_test.go:Example",
		"example_test.go:ExampleLimiter_AllowN",
		"example_test.go:ExampleLimiter_Peek",
		"example_test.go:ExampleLimiter_Wait",
		"example_test.go:ExampleLimiter_Refund",
		"example_test.go:ExampleLimiter_AllowAll",
		"example_test.go:ExampleLimiter_AllowAll_merchantAndGlobal",
		"example_test.go:ExampleLimiter_AllowAll_costPerRule",
		"example_test.go:ExampleLimiter_AllowAllEach",
		"example_test.go:ExampleOptions_fallback",
		"example_test.go:ExampleOptions_leasedBudgets",
		"example_test.go:ExampleOptions_tracing",
		"example_test.go:ExampleCalendar",
		"example_test.go:ExampleLimiter_Block",
		"docs_test.go:ExampleLimiter_Acquire",
		"docs_test.go:ExampleCritical",
		"docs_test.go:Example_longKey",
		"docs_test.go:ExampleLimiter_Meter",
	},
	"docs/overrides.md": {"docs_test.go:ExampleOptions_overrides"},
	"docs/tokens.md":    {"llmlimit/example_test.go:Example", "grpclimit/example_test.go:Example_streamMeter"},
	"docs/http.md": {
		"httplimit/example_test.go:Example",
		"httplimit/example_test.go:Example_concurrency",
		"httplimit/example_test.go:Example_startup",
		"httplimit/example_test.go:Example_login",
		"httplimit/example_test.go:ExampleClientIP",
		"httplimit/example_test.go:Example_shadow",
		"httplimit/example_test.go:ExampleTransport",
		"httplimit/example_test.go:Example_calendar",
		"httplimit/example_test.go:Example_penalty",
		"httplimit/example_test.go:Example_outcome",
		"httplimit/example_test.go:Example_tokens",
	},
	"docs/grpc.md": {
		"grpclimit/example_test.go:Example",
		"grpclimit/example_test.go:Example_refusal",
		"grpclimit/example_test.go:Example_streamRefusal",
		"grpclimit/example_test.go:ExampleNewClient",
		"grpclimit/example_test.go:Example_login",
		"grpclimit/example_test.go:Example_tokens",
	},
}

// fragments are ```go blocks that are not an Example: each is listed with the page that
// holds it, and must still be there (a fragment no page holds is a stale entry).
var fragments = map[string]string{}

func TestDocsExamples(t *testing.T) {
	examples := loadExamples(t)
	pages := loadPages(t)
	used := map[string]bool{}
	for _, page := range sortedKeys(pages) {
		blocks := goBlocks(pages[page])
		shown := map[string]bool{}
		for _, b := range blocks {
			if id, ok := matchExample(b.text, examples); ok {
				shown[id] = true
				continue
			}
			if fp, ok := fragments[b.text]; ok && fp == page {
				used[b.text] = true
				continue
			}
			t.Errorf("%s:%d: a ```go block that is no Example function as it is now (copy the function again, "+
				"or list the block in fragments):\n%s", page, b.line, b.text)
		}
		for _, id := range required[page] {
			if _, ok := examples[id]; !ok {
				t.Errorf("%s must show %s, which does not exist", page, id)
				continue
			}
			if !shown[id] {
				t.Errorf("%s does not show %s as it is now; copy it again:\n%s", page, id, examples[id].src)
			}
		}
	}
	for page := range required {
		if _, ok := pages[page]; !ok {
			t.Errorf("%s is missing", page)
		}
	}
	for text, page := range fragments {
		if !used[text] {
			t.Errorf("fragment listed for %s is on no page:\n%s", page, text)
		}
	}
}

// TestDocsExamplesCatchAChange proves the check can fail: a page holding an example with one
// character changed, or with a line dropped, matches no example.
func TestDocsExamplesCatchAChange(t *testing.T) {
	examples := loadExamples(t)
	ex, ok := examples["example_test.go:Example"]
	if !ok {
		t.Fatal("example_test.go has no func Example")
	}
	page := "intro\n\n```go\n" + ex.src + "```\n"
	blocks := goBlocks(page)
	if len(blocks) != 1 {
		t.Fatalf("found %d go blocks in a page with one", len(blocks))
	}
	if id, ok := matchExample(blocks[0].text, examples); !ok || id != "example_test.go:Example" {
		t.Fatalf("the example itself is not recognised (got %q, %v)", id, ok)
	}
	changed := strings.Replace(ex.src, "Capacity: 100", "Capacity: 101", 1)
	dropped := strings.Replace(ex.src, "\tdefer vk.Close()\n", "", 1)
	for _, bad := range []string{changed, dropped} {
		if bad == ex.src {
			t.Fatal("the mutation changed nothing: update this test")
		}
		if id, ok := matchExample(goBlocks("```go\n" + bad + "```\n")[0].text, examples); ok {
			t.Errorf("a changed copy of Example was taken for %s", id)
		}
	}
}

// TestDocsTranscripts keeps the shell transcripts that claim a golden file true: a fenced
// block right after a line "<!-- golden: PATH -->" must be that file (PATH from the
// repository's root), byte for byte.
func TestDocsTranscripts(t *testing.T) {
	n := 0
	for page, text := range loadPages(t) {
		lines := strings.SplitAfter(text, "\n")
		for i, line := range lines {
			path, ok := strings.CutPrefix(strings.TrimSpace(line), "<!-- golden: ")
			if !ok {
				continue
			}
			path = strings.TrimSuffix(path, " -->")
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
				t.Errorf("%s:%d: no fenced block right after the golden marker", page, i+1)
				continue
			}
			var body strings.Builder
			for _, l := range lines[i+2:] {
				if strings.TrimRight(l, "\n") == "```" {
					break
				}
				body.WriteString(l)
			}
			want, err := os.ReadFile(filepath.Join("..", path))
			if err != nil {
				t.Errorf("%s:%d: %v", page, i+1, err)
				continue
			}
			n++
			if body.String() != string(want) {
				t.Errorf("%s:%d: the block is not %s as it is now; copy it again:\n%s", page, i+1, path, want)
			}
		}
	}
	if n == 0 {
		t.Error("no golden transcript found in the docs: the check reads nothing")
	}
}

// TestDocsNoIssueNumbers: the pages are for users, who never saw the project's issues.
func TestDocsNoIssueNumbers(t *testing.T) {
	issue := regexp.MustCompile(`(?i)\bissues?\s*#?\d+|(^|\s)#\d+\b`)
	for page, text := range loadPages(t) {
		for i, line := range strings.Split(text, "\n") {
			if m := issue.FindString(line); m != "" {
				t.Errorf("%s:%d: %q names an issue", page, i+1, strings.TrimSpace(m))
			}
		}
	}
}

type example struct {
	src string // from "func" to the closing brace and its newline
	doc string // the // lines right above it, or ""
}

// loadExamples reads every Example function of exampleFiles, keyed file:name.
func loadExamples(t *testing.T) map[string]example {
	t.Helper()
	head := regexp.MustCompile(`(?m)^func (Example\w*)\(\) \{\n`)
	out := map[string]example{}
	for _, f := range exampleFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, m := range head.FindAllStringSubmatchIndex(src, -1) {
			end := strings.Index(src[m[0]:], "\n}\n")
			if end < 0 {
				t.Fatalf("%s: func %s has no closing brace at the start of a line", f, src[m[2]:m[3]])
			}
			ex := example{src: src[m[0] : m[0]+end+3]}
			lines := strings.Split(src[:m[0]], "\n")
			lines = lines[:len(lines)-1] // the empty string after the last newline
			i := len(lines)
			for i > 0 && strings.HasPrefix(lines[i-1], "//") {
				i--
			}
			if i < len(lines) {
				ex.doc = strings.Join(lines[i:], "\n") + "\n"
			}
			out[f+":"+src[m[2]:m[3]]] = ex
		}
	}
	if len(out) == 0 {
		t.Fatal("no Example function found")
	}
	return out
}

// loadPages reads README.md and docs/*.md, keyed by their path from the repository's root.
func loadPages(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, "../README.md")
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(filepath.ToSlash(p), "../")] = string(b)
	}
	return out
}

type block struct {
	line int    // of the opening fence, 1-based
	text string // the lines between the fences, each with its newline
}

// goBlocks returns the ```go blocks of a Markdown page.
func goBlocks(page string) []block {
	var out []block
	lines := strings.SplitAfter(page, "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimRight(lines[i], "\n") != "```go" {
			continue
		}
		b := block{line: i + 1}
		var text strings.Builder
		for i++; i < len(lines) && strings.TrimRight(lines[i], "\n") != "```"; i++ {
			text.WriteString(lines[i])
		}
		b.text = text.String()
		out = append(out, b)
	}
	return out
}

// matchExample says which Example a block is: its source, or its comment and its source.
func matchExample(text string, examples map[string]example) (string, bool) {
	for _, id := range sortedKeys(examples) {
		ex := examples[id]
		if text == ex.src || (ex.doc != "" && text == ex.doc+ex.src) {
			return id, true
		}
	}
	return "", false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
