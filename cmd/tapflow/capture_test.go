//go:build linux

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// TestCaptureCmd: usage and bad input name the problem; on a private
// bpffs holding real pinned state, status reports it and detach removes
// it (saying what it discarded), leaving nothing.
func TestCaptureCmd(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"no subcommand", []string{"capture"}, exitUsage, "status|detach"},
		{"unknown subcommand", []string{"capture", "frob"}, exitUsage, "detach|status"},
		{"relative pin dir", []string{"capture", "status", "--pin-dir", "rel/dir"}, exitUsage, "capture.pin_dir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.err) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errb.String(), c.code, c.err)
			}
		})
	}
	prereq.Root(t, "to mount bpffs and load eBPF")
	mnt := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	dir := filepath.Join(mnt, "tapflow")
	o, err := bpf.Load(bpf.Spec{FlowEntries: 64, RingBytes: 1 << 16, Interfaces: 2, ActiveTimeout: time.Hour, PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"capture", "status", "--pin-dir", dir}, &out, &errb); code != exitOK || !strings.Contains(out.String(), bpf.ABI) {
		t.Fatalf("status: exit %d, out %q, err %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"capture", "detach", "--pin-dir", dir}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "removed") {
		t.Fatalf("detach: exit %d, out %q, err %q", code, out.String(), errb.String())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after capture detach", dir)
	}
}
