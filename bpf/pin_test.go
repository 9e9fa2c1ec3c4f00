//go:build linux

package bpf

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// privateBPFFS mounts a bpffs instance of the test's own and returns a pin
// directory below it.
func privateBPFFS(t *testing.T) string {
	t.Helper()
	prereq.Root(t, "to mount bpffs and load eBPF")
	mnt := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	return filepath.Join(mnt, "tapflow")
}

// TestPinAdopt: a second load of the same pin directory adopts the maps —
// a flow counted before is still in the table, the meters kept counting —
// and keeps the pinned sizes when the configured ones changed. State of
// another ABI is refused with a message naming both and the fix, so is a
// second agent while one holds the state, and a pin directory off bpffs. RemovePinned leaves nothing.
func TestPinAdopt(t *testing.T) {
	dir := privateBPFFS(t)
	s := Spec{FlowEntries: 64, RingBytes: 1 << 16, Interfaces: 2, ActiveTimeout: time.Hour, PinDir: dir}
	o, err := Load(s)
	if err != nil {
		t.Fatal(err)
	}
	if o.Adopted() {
		t.Fatal("first load reports adopted")
	}
	if err := o.SetSlot(7, 1); err != nil {
		t.Fatal(err)
	}
	frame := benchFrame(0)
	if _, _, err := o.Ingress().Benchmark(frame, 3, nil); err != nil {
		t.Fatal(err)
	}
	o.Close()
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("pin dir %s: %v, mode %v; want 0700", dir, err, st.Mode().Perm())
	}

	s.FlowEntries = 128 // a config change: the pinned size wins
	o, err = Load(s)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Adopted() || o.Spec().FlowEntries != 64 || len(o.AdoptedSizes()) != 1 {
		t.Fatalf("adopted %v, flow entries %d, diffs %v; want the pinned 64", o.Adopted(), o.Spec().FlowEntries, o.AdoptedSizes())
	}
	flows, err := o.Flows()
	if err != nil {
		t.Fatal(err)
	}
	var pkts uint64
	for _, f := range flows {
		pkts += f.Val.Packets
	}
	if pkts != 3 {
		t.Errorf("adopted table holds %d packets, want the 3 counted before", pkts)
	}
	slots, err := o.Slots()
	if err != nil || slots[7] != 1 {
		t.Errorf("adopted interface slots %v (%v), want 7→1", slots, err)
	}

	if _, err := Load(s); err == nil || !strings.Contains(err.Error(), "in use by another running tapflow agent") {
		t.Errorf("a second load while the first holds the state: err %v, want in use", err)
	}

	other := filepath.Join(dir, "abi-000000000000")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(s); err == nil || !strings.Contains(err.Error(), "abi-000000000000") || !strings.Contains(err.Error(), "--detach") {
		t.Errorf("state of another ABI: err %v, want one naming it and --detach", err)
	}
	os.Remove(other)
	if _, err := Load(Spec{FlowEntries: 64, RingBytes: 1 << 16, Interfaces: 2, ActiveTimeout: time.Hour, PinDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "not on a bpf filesystem") {
		t.Errorf("pin dir off bpffs: err %v", err)
	}
	o.Close()
	if _, err := RemovePinned(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after RemovePinned", dir)
	}
}
