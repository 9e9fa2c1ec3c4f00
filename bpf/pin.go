//go:build linux

package bpf

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Pinning keeps the kernel state of the capture alive across agent
// restarts: the maps (flow tables, flow cache, meters, interface slots,
// ring buffer) and the tcx links are pinned in bpffs under
// <pin dir>/<ABI>/, so a restarted agent loads the same maps, swaps its
// freshly loaded programs into the running links (link update: atomic, no
// packet missed) and carries on with the table and the unread ring.
//
// ABI is the hash of flow.h, the kernel↔Go contract: a program whose
// structs changed cannot use the old maps. An agent that finds state of
// another ABI refuses to start (its programs still count on the taps);
// the old version exports it with --detach first (docs/operations.md).

//go:embed flow.h
var flowHeader []byte

// ABI names the layout of the pinned maps: the first 12 hex digits of
// sha256(flow.h).
var ABI = func() string {
	h := sha256.Sum256(flowHeader)
	return "abi-" + hex.EncodeToString(h[:6])
}()

// bpffsMagic is BPF_FS_MAGIC.
const bpffsMagic = 0xcafe4a11

// pinnedMaps are the maps that hold kernel state; .rodata is per load.
var pinnedMaps = []string{flowMapFlows4, flowMapFlows6, flowMapRecords, flowMapMeters, flowMapIfSlots,
	flowMapIfSlotsBig, flowMapCache0, flowMapCache1, flowMapCaches}

// Userspace-only pinned maps: the capture's bookkeeping per meter slot.
const (
	mapMeterState = "meter_state" // slot → ifindex, name, meters at attach
	mapMeterPub   = "meter_pub"   // slot*2+dir → meters last published (acked)
)

// MeterState is what the capture remembers of a meter slot across
// restarts: the interface it belongs to and its meters when it was
// attached (so totals cover the interface's whole life).
type MeterState struct {
	Ifindex uint32
	Used    uint32 // 1 while the slot is owned
	Name    [16]byte
	First   [2]Meter
}

// IfName returns the name as a string.
func (s *MeterState) IfName() string { return strings.TrimRight(string(s.Name[:]), "\x00") }

// StateDir is where objects of this ABI are pinned below dir.
func StateDir(dir string) string { return filepath.Join(dir, ABI) }

// LinkDir is where the attach package pins the tcx links.
func LinkDir(dir string) string { return filepath.Join(StateDir(dir), "links") }

// preparePinDir checks that dir is on bpffs, creates it (0700, owned by
// the running user) and refuses state of another ABI. It reports whether
// state of this ABI exists.
func preparePinDir(dir string) (exists bool, err error) {
	if !filepath.IsAbs(dir) {
		return false, fmt.Errorf("capture.pin_dir %q must be an absolute path on bpffs, e.g. /sys/fs/bpf/tapflow", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create capture.pin_dir %s: %w (is a bpf filesystem mounted above it? mount -t bpf bpf /sys/fs/bpf)", dir, explain(err))
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs capture.pin_dir %s: %w", dir, err)
	}
	if uint32(st.Type) != bpffsMagic {
		return false, fmt.Errorf("capture.pin_dir %s is not on a bpf filesystem: mount one (mount -t bpf bpf /sys/fs/bpf) or set capture.pin_dir below it", dir)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("read capture.pin_dir %s: %w", dir, explain(err))
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "abi-") && e.Name() != ABI {
			return false, fmt.Errorf("capture.pin_dir %s holds the capture state of another tapflow version (%s, this one is %s), whose programs still count on the taps: "+
				"export it with that version (`tapflow agent --detach`), or discard it with `tapflow capture detach --pin-dir %s`, then start this one", dir, e.Name(), ABI, dir)
		}
	}
	if err := os.MkdirAll(LinkDir(dir), 0o700); err != nil {
		return false, fmt.Errorf("create %s: %w", LinkDir(dir), explain(err))
	}
	_, err = os.Stat(filepath.Join(StateDir(dir), flowMapFlows4))
	return err == nil, nil
}

// lockPinDir takes an exclusive lock on the pin directory for the life of
// the objects: two agents adopting one state would both read the ring
// and double every record. The kernel drops the lock when the process
// dies, also by SIGKILL.
func lockPinDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open capture.pin_dir %s: %w", dir, explain(err))
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("capture.pin_dir %s is in use by another running tapflow agent: stop it first (one agent per host and pin_dir)", dir)
		}
		return nil, fmt.Errorf("lock capture.pin_dir %s: %w", dir, err)
	}
	return f, nil
}

// adoptSizes makes s match the pinned maps: their sizes win over the
// configured ones until the state is detached (a resize would need new
// maps, and the old ones hold the table). It returns the differences.
func adoptSizes(s *Spec, dir string) ([]string, error) {
	size := func(name string) (uint32, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			return 0, fmt.Errorf("load pinned map %s: %w", name, explain(err))
		}
		defer m.Close()
		return m.MaxEntries(), nil
	}
	var diffs []string
	for _, f := range []struct {
		name string
		p    *uint32
		from func(uint32) uint32
	}{
		{flowMapFlows4, &s.FlowEntries, nil},
		{flowMapRecords, &s.RingBytes, nil},
		{flowMapIfSlotsBig, &s.Interfaces, nil},
		{flowMapCache0, &s.CacheSlots, nil},
	} {
		n, err := size(f.name)
		if err != nil {
			return nil, err
		}
		want := *f.p
		if f.name == flowMapCache0 {
			want = s.cacheSlots()
		}
		if n != want {
			diffs = append(diffs, fmt.Sprintf("%s %d (configured %d)", f.name, n, want))
			*f.p = n
		}
	}
	n6, err := size(flowMapFlows6)
	if err != nil {
		return nil, err
	}
	if n6 != s.flow6Entries() {
		return nil, fmt.Errorf("pinned flows6 has %d entries, flows4 %d: not a pair this version made; discard with `tapflow capture detach`", n6, s.FlowEntries)
	}
	return diffs, nil
}

// userMaps creates (or loads) the userspace bookkeeping maps.
func (o *Objects) userMaps() error {
	opts := ebpf.MapOptions{PinPath: o.stateDir}
	var err error
	o.meterState, err = ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name: mapMeterState, Type: ebpf.Array, KeySize: 4, ValueSize: uint32(meterStateSize),
		MaxEntries: o.spec.Interfaces + 1, Pinning: ebpf.PinByName,
	}, opts)
	if err != nil {
		return fmt.Errorf("meter state map: %w", explain(err))
	}
	o.meterPub, err = ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name: mapMeterPub, Type: ebpf.Array, KeySize: 4, ValueSize: uint32(MeterSize),
		MaxEntries: (o.spec.Interfaces + 1) * 2, Pinning: ebpf.PinByName,
	}, opts)
	if err != nil {
		return fmt.Errorf("published meter map: %w", explain(err))
	}
	return nil
}

// Pinned reports whether the objects are pinned; Adopted whether they
// were found pinned (a restart) rather than created.
func (o *Objects) Pinned() bool { return o.stateDir != "" }

// Adopted reports whether the maps held the state of a previous run.
func (o *Objects) Adopted() bool { return o.adopted }

// PinDir is the configured pin directory ("" when not pinned).
func (o *Objects) PinDir() string { return o.spec.PinDir }

// MeterSlotState reads what the previous runs recorded of a slot.
func (o *Objects) MeterSlotState(slot uint32) (MeterState, error) {
	var s MeterState
	if o.meterState == nil {
		return s, nil
	}
	if err := o.meterState.Lookup(slot, &s); err != nil {
		return s, fmt.Errorf("read meter state of slot %d: %w", slot, err)
	}
	return s, nil
}

// SetMeterSlotState records a slot's owner (Used 0: free).
func (o *Objects) SetMeterSlotState(slot uint32, s *MeterState) error {
	if o.meterState == nil {
		return nil
	}
	if err := o.meterState.Put(slot, s); err != nil {
		return fmt.Errorf("write meter state of slot %d: %w", slot, err)
	}
	return nil
}

// PublishedMeter is the slot's meter as last published downstream.
func (o *Objects) PublishedMeter(slot uint32, dir Direction) (Meter, error) {
	var m Meter
	if o.meterPub == nil {
		return m, nil
	}
	if err := o.meterPub.Lookup(slot*2+uint32(dir), &m); err != nil {
		return m, fmt.Errorf("read published meter of slot %d: %w", slot, err)
	}
	return m, nil
}

// SetPublishedMeter records the slot's meter as published. Safe for
// concurrent use (one map update).
func (o *Objects) SetPublishedMeter(slot uint32, dir Direction, m Meter) error {
	if o.meterPub == nil {
		return nil
	}
	if err := o.meterPub.Put(slot*2+uint32(dir), &m); err != nil {
		return fmt.Errorf("write published meter of slot %d: %w", slot, err)
	}
	return nil
}

// Slots lists the ifindex → meter slot registrations in the maps (after
// an adopt: those of the previous run).
func (o *Objects) Slots() (map[uint32]uint32, error) {
	out := map[uint32]uint32{}
	var k, v uint32
	it := o.objs.IfSlots.Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			out[k] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate interface slots: %w", err)
	}
	it = o.objs.IfSlotsBig.Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			out[k] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate interface slots: %w", err)
	}
	return out, nil
}

// adoptCache finds which flow-cache generation the packet path uses after
// the load re-wrote the array of maps ({cache0, cache1}: the load is a
// flip) and marks the other as still to flush: it may hold slots of the
// previous run's current generation.
func (o *Objects) adoptCache() error {
	var id ebpf.MapID
	if err := o.objs.Caches.Lookup(uint32(0), &id); err != nil {
		return fmt.Errorf("read current flow cache generation: %w", err)
	}
	info, err := o.objs.Cache1.Info()
	if err != nil {
		return fmt.Errorf("flow cache info: %w", err)
	}
	o.cur = 0
	if mid, ok := info.ID(); ok && mid == id {
		o.cur = 1
	}
	o.flushing, o.flushPos, o.flushBoth = true, 0, true
	return nil
}

// RemovePinned detaches and deletes everything pinned below dir (every
// ABI): tcx links first (their programs leave the taps), then the maps.
// What the maps still held is gone; run the agent with --detach to export
// it first. It returns the paths removed.
func RemovePinned(dir string) ([]string, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var links, others, dirs []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			dirs = append(dirs, p)
		case filepath.Base(filepath.Dir(p)) == "links":
			links = append(links, p)
		default:
			others = append(others, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, explain(err))
	}
	var errs []error
	var removed []string
	for _, p := range links {
		if err := detachPinnedLink(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	for _, p := range others {
		if err := os.Remove(p); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", p, explain(err)))
			continue
		}
		removed = append(removed, p)
	}
	slices.Reverse(dirs) // children first
	for _, p := range dirs {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, explain(err)))
		}
	}
	return removed, errors.Join(errs...)
}

// Unpin removes this run's pins (maps and the state directory) after a
// full detach; links are the attach package's and must be gone first.
func (o *Objects) Unpin() error {
	if o.stateDir == "" {
		return nil
	}
	_, err := RemovePinned(o.spec.PinDir)
	return err
}

// meterStateSize is the value size of the meter state map.
const meterStateSize = int(unsafe.Sizeof(MeterState{}))

// detachPinnedLink detaches a pinned link from its hook and unpins it.
func detachPinnedLink(p string) error {
	l, err := link.LoadPinnedLink(p, nil)
	if err != nil {
		// Not a link (or unreadable): just unpin it.
		if rerr := os.Remove(p); rerr != nil {
			return fmt.Errorf("unpin %s: %w", p, explain(errors.Join(err, rerr)))
		}
		return nil
	}
	defer l.Close()
	var errs []error
	if err := l.Detach(); err != nil && !errors.Is(err, unix.ENOLINK) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("detach %s: %w", p, err))
	}
	if err := l.Unpin(); err != nil {
		errs = append(errs, fmt.Errorf("unpin %s: %w", p, explain(err)))
	}
	return errors.Join(errs...)
}

// PinnedSummary describes the capture state pinned below a pin directory.
type PinnedSummary struct {
	ABIs       []string // state directories (abi-…); this version's is ABI
	Links      int      // pinned tcx links
	Flows      int      // flow-table entries (this ABI; flow-cache slots not counted)
	Bytes      uint64   // bytes and packets they hold, not yet exported
	Packets    uint64
	RingUnread uint64 // ring-buffer bytes not yet durable downstream
}

// Summarize reads what is pinned below dir without changing it.
func Summarize(dir string) (PinnedSummary, error) {
	var s PinnedSummary
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read %s: %w", dir, explain(err))
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "abi-") {
			continue
		}
		s.ABIs = append(s.ABIs, e.Name())
		if ls, err := os.ReadDir(filepath.Join(dir, e.Name(), "links")); err == nil {
			s.Links += len(ls)
		}
	}
	state := StateDir(dir)
	for _, name := range []string{flowMapFlows4, flowMapFlows6} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(state, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return s, fmt.Errorf("load pinned %s: %w", name, explain(err))
		}
		var v FlowEnt
		key := make([]byte, m.KeySize())
		it := m.Iterate()
		for it.Next(&key, &v) {
			val := v.Val()
			s.Flows++
			s.Bytes += val.Bytes
			s.Packets += val.Packets
		}
		err = it.Err()
		m.Close()
		if err != nil {
			return s, fmt.Errorf("iterate pinned %s: %w", name, err)
		}
	}
	if m, err := ebpf.LoadPinnedMap(filepath.Join(state, flowMapRecords), nil); err == nil {
		if r, err := OpenRing(m); err == nil {
			s.RingUnread = r.Unread()
			r.Close()
		}
		m.Close()
	}
	return s, nil
}

// Held counts what the kernel still holds of this run's flows, not yet
// exported: flow-table entries and flow-cache slots (both generations),
// with their bytes. A stop that must let go of them counts them as
// stranded.
func (o *Objects) Held() (records int, bytes uint64, err error) {
	flows, err := o.Flows()
	if err != nil {
		return 0, 0, err
	}
	for _, f := range flows {
		records++
		bytes += f.Val.Bytes
	}
	err = o.cacheSlots(func(c *FlowCent) {
		records++
		bytes += c.Bytes
	})
	return records, bytes, err
}
