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

// TestSeqStateRange: a reservation file the agent cannot continue from
// (not a number, negative, so high the next block would wrap) is refused
// with the fix; a sane one is continued above.
func TestSeqStateRange(t *testing.T) {
	for _, c := range []struct {
		content string
		ok      bool
	}{
		{"1700000000000000\n", true},
		{"abc", false},
		{"-5", false},
		{"9223372036854775807", false},
		{"4611686018427387904", true}, // 2^62: room for many blocks
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "flows.seq"), []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := newSeqAllocatorFile(dir, "flows.seq")
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok=%v", c.content, err, c.ok)
			continue
		}
		if err != nil {
			continue
		}
		n, err := a.Next()
		if err != nil || n < 0 {
			t.Errorf("%q: next %d, %v", c.content, n, err)
		}
	}
}
