package helm

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/deploy-job.json from the chart")

// jobValues are the values testdata/deploy-job.json is rendered with: a server that needs the
// lua-security warning accepted (the test images' Valkey 8.0.1 does) and the servers' CA from a
// Secret, as a TLS deployment gives it.
const jobValues = minimal + `
serverCA: {secret: valkey-ca, key: ca.crt}
deployJob: {acceptWarnings: [lua-security]}
`

// The deploy Job's pod, as the chart renders it, is testdata/deploy-job.json: the rlfn image's
// test (cmd/rlfn, TestImage) runs the image with exactly its arguments, variables, mounts and
// security context, so a change here is one that test runs (go test -run TestDeployJobGolden
// -update rewrites it, for the diff to be reviewed).
func TestDeployJobGolden(t *testing.T) {
	m, err := render(t, jobValues)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(m.job.Spec.Template.Spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	file := filepath.Join("testdata", "deploy-job.json")
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the deploy Job's pod is not %s (go test -run TestDeployJobGolden -update, then run cmd/rlfn's TestImage):\n%s", file, got)
	}
}
