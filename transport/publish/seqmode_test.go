package publish

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSeqStateMode: the batch sequence reservation is 0600 in a 0700
// directory whatever the umask.
func TestSeqStateMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "agent")
	a, err := newSeqAllocatorFile(dir, "flows.seq")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Next(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, a.path: 0o600} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", p, st.Mode().Perm(), want)
		}
	}
}
