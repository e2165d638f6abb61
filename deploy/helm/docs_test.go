package helm

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"
)

// shellWords splits one shell command line as sh does for the docs' commands: words apart by
// blanks, a backslash before a newline joins lines, 'single quotes' keep what they hold, and
// a backslash outside them keeps the next character.
func shellWords(line string) []string {
	var words []string
	var w strings.Builder
	in, quoted := false, false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			w.WriteByte(c)
		case c == '\'':
			quoted, in = true, true
		case c == '\\' && i+1 < len(line):
			i++
			if line[i] != '\n' {
				w.WriteByte(line[i])
				in = true
			}
		case c == ' ' || c == '\t' || c == '\n':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		case c == '#':
			if !in {
				return words
			}
			w.WriteByte(c)
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// Every helm install command of docs/envoy.md's chart section, its --set and --set-file
// parsed by Helm's own parser (the file ratelimit.yaml being minimal's), renders: a command
// there that the chart refuses (a Secret for the service's URL without the deployer's, no
// limits) is one a reader would copy.
func TestDocsInstallCommands(t *testing.T) {
	md, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(md)
	section = section[strings.Index(section, "## The Helm chart"):]
	section = section[:strings.Index(section[1:], "\n## ")+1]
	vals, err := parseValues(minimal)
	if err != nil {
		t.Fatal(err)
	}
	limits := vals["config"].(map[string]any)["configMap"].(map[string]any)["files"].(map[string]any)["ratelimit.yaml"].(string)
	commands := regexp.MustCompile(`(?m)^helm install (?:[^\n]*\\\n)*[^\n]*`).FindAllString(section, -1)
	if len(commands) < 2 {
		t.Fatalf("%d helm install commands in the chart's section", len(commands))
	}
	for _, command := range commands {
		words := shellWords(command)
		values := map[string]any{}
		for i := 0; i < len(words); i++ {
			switch words[i] {
			case "--set":
				i++
				if err := strvals.ParseInto(words[i], values); err != nil {
					t.Errorf("%s: %v", command, err)
				}
			case "--set-file":
				i++
				err := strvals.ParseIntoFile(words[i], values, func(path []rune) (any, error) {
					if string(path) != "ratelimit.yaml" {
						t.Errorf("%s: --set-file of %s", command, string(path))
					}
					return limits, nil
				})
				if err != nil {
					t.Errorf("%s: %v", command, err)
				}
			}
		}
		m, err := renderValues(t, words[2], values)
		if err != nil {
			t.Errorf("%s: %v", command, err)
			continue
		}
		if m.configMap == nil || m.configMap.Data["ratelimit.yaml"] != limits {
			t.Errorf("%s: ConfigMap %+v", command, m.configMap)
		}
	}
}
