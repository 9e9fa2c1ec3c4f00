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
var failpointMarks = []string{FailpointEnv, "parquet-after-commit:", "consume-decode:"}

// TestReleaseBuildHasNoFailpoint: make build and make package build
// ./cmd/tapflow without build tags, and such a build has no failpoint:
// it cannot read TAPFLOW_FAILPOINT. The same check on a build with the
// tapflow_failpoints tag finds it (the check can fail). Both builds use
// the chaos tests' flags (CGO_ENABLED=0, no -race), so they share their
// build cache.
func TestReleaseBuildHasNoFailpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tapflow binary twice")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"build", "package"} {
		out, err := exec.Command("make", "-C", root, "-n", target).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		var builds int
		for l := range strings.Lines(string(out)) {
			if strings.Contains(l, " build ") && strings.Contains(l, "./cmd/tapflow") {
				builds++
				if strings.Contains(l, "-tags") || strings.Contains(l, "tapflow_failpoints") {
					t.Errorf("make %s builds with tags: %s", target, l)
				}
			}
		}
		if builds != 1 {
			t.Errorf("make -n %s shows %d go builds of ./cmd/tapflow, want 1:\n%s", target, builds, out)
		}
	}

	dir := t.TempDir()
	for _, c := range []struct {
		name string
		tags []string
		want bool
	}{{"release", nil, false}, {"tagged", []string{"-tags", "tapflow_failpoints"}, true}} {
		bin := filepath.Join(dir, c.name)
		cmd := exec.Command("go", append(append([]string{"build"}, c.tags...), "-o", bin, "./cmd/tapflow")...)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", c.tags, err, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range failpointMarks {
			if got := bytes.Contains(b, []byte(m)); got != c.want {
				t.Errorf("%s build: contains %q = %v, want %v", c.name, m, got, c.want)
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
