package parquet

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// failpointMarks are strings only the failpoint code puts in a binary.
var failpointMarks = []string{FailpointEnv, "parquet-after-commit:"}

// TestReleaseBuildHasNoFailpoint: `make build` builds bin/tapflow without
// the tapflow_failpoints tag, so the binary has no failpoint and cannot
// read TAPFLOW_FAILPOINT; the same check on a build with the tag finds
// it (the check can fail). `make package` builds with the same line.
func TestReleaseBuildHasNoFailpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tapflow binary twice")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// make package: its go build line must carry no tags either.
	out, err := exec.Command("make", "-C", root, "-n", "package").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n package: %v\n%s", err, out)
	}
	var builds int
	for l := range strings.Lines(string(out)) {
		if strings.Contains(l, " build ") && strings.Contains(l, "./cmd/tapflow") {
			builds++
			if strings.Contains(l, "-tags") || strings.Contains(l, "tapflow_failpoints") {
				t.Errorf("make package builds with tags: %s", l)
			}
		}
	}
	if builds != 1 {
		t.Errorf("make -n package shows %d go builds of ./cmd/tapflow, want 1:\n%s", builds, out)
	}

	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	if out, err := exec.Command("make", "-C", root, "build", "BIN="+release).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	tagged := filepath.Join(dir, "tagged")
	cmd := exec.Command("go", "build", "-tags", "tapflow_failpoints", "-o", tagged, "./cmd/tapflow")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags tapflow_failpoints: %v\n%s", err, out)
	}
	for _, c := range []struct {
		bin  string
		want bool
	}{{release, false}, {tagged, true}} {
		b, err := os.ReadFile(c.bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range failpointMarks {
			if got := bytes.Contains(b, []byte(m)); got != c.want {
				t.Errorf("%s: contains %q = %v, want %v", filepath.Base(c.bin), m, got, c.want)
			}
		}
	}
}

// TestFailpointArmedOnlyWithTag: a build without the tag (go test ./...,
// the release binary) ignores TAPFLOW_FAILPOINT; one with it
// (go test -tags tapflow_failpoints) arms the failpoint.
func TestFailpointArmedOnlyWithTag(t *testing.T) {
	t.Setenv(FailpointEnv, "parquet-after-commit:3")
	want := 0
	if failpointsTagged {
		want = 3
	}
	if n := failpointAfterCommit(); n != want {
		t.Fatalf("tagged %v: failpoint after commit %d, want %d", failpointsTagged, n, want)
	}
}
