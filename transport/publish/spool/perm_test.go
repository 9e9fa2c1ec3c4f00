package spool

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSpoolFileModes: the spool (agent traffic not yet published) is
// owner-only, 0600 files in a 0700 directory, even under umask 0.
func TestSpoolFileModes(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "agent", "spool")
	s := open(t, testCfg(dir))
	appendN(t, s, 1, 50, 4096)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		} else {
			n++
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", p, st.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no spool file")
	}
	// The parent the spool created is not private (data_dir is shared
	// with the Parquet output's readers) but never world-accessible.
	if st, err := os.Stat(filepath.Dir(dir)); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("parent %s: %v %v, want 0750", filepath.Dir(dir), st.Mode().Perm(), err)
	}
}
