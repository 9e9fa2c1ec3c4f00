package prereq

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// stopping the goroutine.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
}

// TestStrictness: as root or with CI set a missing prerequisite fails,
// naming it, the fix and why it is a failure; otherwise it skips with the
// same words; a prerequisite that is there does neither.
func TestStrictness(t *testing.T) {
	for _, tc := range []struct {
		name      string
		uid       int
		ci        string
		call      func(tb testing.TB)
		wantFatal bool
		wantSkip  bool
		want      []string
	}{
		{"root, missing command", 0, "", func(tb testing.TB) { Command(tb, "tapflow-no-such-command", "make deps installs it") }, true, false,
			[]string{SkipPrefix, "command tapflow-no-such-command", "fix: make deps installs it", "running as root"}},
		{"user, CI set, missing command", 1000, "true", func(tb testing.TB) { Command(tb, "tapflow-no-such-command", "make deps") }, true, false,
			[]string{"CI=true is set"}},
		{"user, CI=false, missing command", 1000, "false", func(tb testing.TB) { Command(tb, "tapflow-no-such-command", "make deps") }, false, true,
			[]string{SkipPrefix, "command tapflow-no-such-command", "as root or with CI set this fails"}},
		{"user, CI=0", 1000, "0", func(tb testing.TB) { Require(tb, "tmpfs", errors.New("EPERM"), "") }, false, true,
			[]string{SkipPrefix + "tmpfs: EPERM"}},
		{"user, no CI, not root", 1000, "", func(tb testing.TB) { Root(tb, "mount a tmpfs") }, false, true,
			[]string{"root (running as uid 1000): mount a tmpfs", "fix: run the tests as root"}},
		{"user, CI, not root", 1000, "1", func(tb testing.TB) { Root(tb, "mount a tmpfs") }, true, false,
			[]string{"root (running as uid 1000)", "CI=1 is set"}},
		{"root is there", 0, "", func(tb testing.TB) { Root(tb, "mount a tmpfs") }, false, false, nil},
		{"no error", 0, "1", func(tb testing.TB) { Require(tb, "eBPF", nil, "make deps") }, false, false, nil},
		{"command there", 0, "", func(tb testing.TB) {
			if p := Command(tb, "sh", ""); !strings.HasSuffix(p, "/sh") {
				tb.Fatalf("Command(sh) = %q", p)
			}
		}, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := geteuid
			geteuid = func() int { return tc.uid }
			defer func() { geteuid = old }()
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			tc.call(r)
			if (r.fatal != "") != tc.wantFatal || (r.skip != "") != tc.wantSkip {
				t.Fatalf("fatal %q, skip %q; want fatal %v, skip %v", r.fatal, r.skip, tc.wantFatal, tc.wantSkip)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.fatal+r.skip, w) {
					t.Errorf("%q lacks %q", r.fatal+r.skip, w)
				}
			}
		})
	}
}
