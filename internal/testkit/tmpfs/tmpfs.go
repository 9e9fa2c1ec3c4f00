// Package tmpfs gives tests a small filesystem of their own (a tmpfs
// mounted on a directory of t.TempDir, unmounted at cleanup) and fills it,
// for the disk-full tests of the collector's output.
package tmpfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// Mount mounts a tmpfs of size bytes on a new directory below t.TempDir
// and returns it. It needs root (CAP_SYS_ADMIN): without it the test fails
// in CI and skips elsewhere, as prereq decides.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	prereq.Root(t, "to mount a tmpfs")
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		prereq.Require(t, "a tmpfs on "+dir, err, "run as root with CAP_SYS_ADMIN, not in a container that forbids mounts")
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes dir/filler until the filesystem refuses even 512 bytes
// (ENOSPC) and returns the filler's path and size: truncating it frees
// exactly what a test wants to give back.
func Fill(t testing.TB, dir string) (string, int64) {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for _, n := range []int{len(chunk), 512} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", dir, err)
				}
				break
			}
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	return filler, st.Size()
}
