//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Kernel structs, mirrored from flow.h by bpf2go.
type (
	// FlowKey is struct flow_key.
	FlowKey = flowFlowKey
	// FlowKey4 is struct flow_key4, the key of the IPv4 table.
	FlowKey4 = flowFlowKey4
	// FlowKey6 is struct flow_key6, the key of the IPv6 table.
	FlowKey6 = flowFlowKey6
	// FlowVal is struct flow_val, the value of a record.
	FlowVal = flowFlowVal
	// FlowEnt is struct flow_ent, the value of a flow-table entry.
	FlowEnt = flowFlowEnt
	// FlowRecord is struct flow_record, one ring-buffer record.
	FlowRecord = flowFlowRecord
	// Meter is struct meter, one per (interface slot, direction) per CPU.
	Meter = flowMeter
	// SweepArgs is struct sweep_args, the sweep program's context.
	SweepArgs = flowSweepArgs
	// FlowCent is struct flow_cent, one slot of the per-CPU flow cache.
	FlowCent = flowFlowCent
	// FlushArgs is struct flush_args, the flush program's context.
	FlushArgs = flowFlushArgs
)

// Sizes of the kernel structs, checked against the C layout by tests.
const (
	FlowKeySize    = int(unsafe.Sizeof(FlowKey{}))
	FlowRecordSize = int(unsafe.Sizeof(FlowRecord{}))
	MeterSize      = int(unsafe.Sizeof(Meter{}))
)

// Direction is enum flow_direction: from the VM's point of view.
type Direction uint8

// Directions. Tap ingress carries what the VM sends (tx).
const (
	DirTX Direction = 0
	DirRX Direction = 1
)

func (d Direction) String() string {
	if d == DirRX {
		return "rx"
	}
	return "tx"
}

// EndReason is enum end_reason.
type EndReason uint8

// End reasons, as in flow.h.
const (
	EndFIN           EndReason = 1
	EndRST           EndReason = 2
	EndActiveTimeout EndReason = 3
	EndIdleTimeout   EndReason = 4
	EndOverflow      EndReason = 5
	EndShutdown      EndReason = 6
	// EndInventoryChange is userspace's alone: the export of every live
	// flow before an attribution-changing inventory swap (capture's
	// ExportLive) hands it to the sweep program in sweep_args.reason, which
	// the kernel copies into the records and the claimed entries' dead flag
	// (so racing packets drain with it too). It is deliberately not in
	// flow.h: the ABI hash of the pinned state stays the same.
	EndInventoryChange EndReason = 7
)

var endReasonNames = [...]string{"", "fin", "rst", "active_timeout", "idle_timeout", "overflow", "shutdown", "inventory_change"}

func (r EndReason) String() string {
	if int(r) < len(endReasonNames) && r != 0 {
		return endReasonNames[r]
	}
	return fmt.Sprintf("end_reason(%d)", uint8(r))
}

// EndReasons lists every reason a record can carry, for zero-seeding metrics.
func EndReasons() []EndReason {
	return []EndReason{EndFIN, EndRST, EndActiveTimeout, EndIdleTimeout, EndOverflow, EndShutdown, EndInventoryChange}
}

// ifSlotArrayMax mirrors IFSLOT_ARRAY_MAX: ifindexes below it use the array.
const ifSlotArrayMax = 65536

// Spec sizes the kernel objects. Use SpecFor to derive it from a budget.
type Spec struct {
	FlowEntries   uint32        // IPv4 flow-table entries; the IPv6 table has a quarter (Flow6Entries)
	RingBytes     uint32        // ring buffer bytes: a power of two ≥ page size
	Interfaces    uint32        // meter slots (interfaces watched at once)
	ActiveTimeout time.Duration // export long flows at least this often
	CacheSlots    uint32        // per-CPU flow-cache slots per generation: a power of two; 0 = DefaultCacheSlots
	NoCache       bool          // every packet goes to the flow table (tests and benchmarks)
	// PinDir, when set, pins the maps in bpffs below it (see pin.go) and
	// adopts those a previous run pinned there; their sizes win.
	PinDir string
}

// DefaultCacheSlots is the per-CPU flow cache's size (slots per CPU per
// generation; two generations, 128 B a slot: 64 KiB per CPU). Measured
// before admission (every miss evicted): with 20,000 flows cycling 1024
// slots cost +280 ns per packet over the table alone, 256 slots +60 (the
// slots leave the CPU caches); a hit costs the same at either size. Since
// a flow is admitted only on its second packet in a row at its slot, a
// miss costs the look at the slot, and a CPU where the slots count few of
// the packets probed bypasses the cache for a while
// (BenchmarkPerPacket/flows=N/burst=B).
const DefaultCacheSlots = 256

// flowCentBytes is the size of one cache slot (struct flow_cent).
const flowCentBytes = int64(unsafe.Sizeof(FlowCent{}))

func (s Spec) cacheSlots() uint32 {
	if s.CacheSlots == 0 {
		return DefaultCacheSlots
	}
	return s.CacheSlots
}

// CacheBytes is the memory of the flow cache: two generations of
// CacheSlots slots for each of cpus CPUs.
func (s Spec) CacheBytes(cpus int) int64 {
	return 2 * int64(s.cacheSlots()) * flowCentBytes * int64(max(cpus, 1))
}

// Per-entry cost of the flow tables, from the kernel's htab layout:
// htab_elem header (48) + key + value (48), rounded up (buckets not
// counted, as before the split): IPv4 key 32 → 128, IPv6 key 56 → 160.
const (
	flowEntryBytes4 = 128
	flowEntryBytes6 = 160
	// flow6Share: the IPv6 table has FlowEntries/flow6Share entries.
	flow6Share = 4
	// flowEntryBytes is the table memory per FlowEntries unit (one IPv4
	// entry and a quarter of an IPv6 entry).
	flowEntryBytes = flowEntryBytes4 + flowEntryBytes6/flow6Share
)

// Flow6Entries is the size of the IPv6 flow table: a quarter of the IPv4
// table (at least 1). Both tables are preallocated (a table hit or insert
// never allocates); a full table turns new flows into overflow records.
func (s Spec) Flow6Entries() uint32 { return s.flow6Entries() }

func (s Spec) flow6Entries() uint32 { return max(1, s.FlowEntries/flow6Share) }

// SpecFor derives sizes from a memory budget: a quarter (at most 64 MiB,
// at least 256 KiB per CPU) goes to the ring buffer, the meters take
// (interfaces+1)·2·64 B per CPU, the flow cache 2·cacheSlots·128 B per CPU
// (cacheSlots 0 = DefaultCacheSlots: 64 KiB), and the
// rest is flow table (IPv4, and an IPv6 table a quarter its size).
func SpecFor(budget int64, cpus, interfaces int, active time.Duration, cacheSlots uint32) (Spec, error) {
	if cpus < 1 {
		cpus = 1
	}
	meterBytes := int64(interfaces+1) * 2 * int64(MeterSize) * int64(cpus)
	ring := int64(1) << 62
	for ring > budget/4 {
		ring >>= 1
	}
	if ring > 64<<20 {
		ring = 64 << 20
	}
	minRing := int64(256<<10) * int64(cpus)
	for ring < minRing {
		ring <<= 1
	}
	cacheBytes := Spec{CacheSlots: cacheSlots}.CacheBytes(cpus)
	rest := budget - ring - meterBytes - cacheBytes
	entries := rest / flowEntryBytes
	if entries < 64 {
		return Spec{}, fmt.Errorf("memory budget %d B leaves %d B for the flow table after a %d B ring buffer, %d B of meters and a %d B flow cache: raise it to at least %d B",
			budget, rest, ring, meterBytes, cacheBytes, ring+meterBytes+cacheBytes+64*flowEntryBytes)
	}
	if entries > 1<<26 {
		entries = 1 << 26
	}
	return Spec{FlowEntries: uint32(entries), RingBytes: uint32(ring), Interfaces: uint32(interfaces), ActiveTimeout: active, CacheSlots: cacheSlots}, nil
}

// Validate checks a Spec before anything is created.
func (s Spec) Validate() error {
	var errs []error
	if s.FlowEntries < 1 {
		errs = append(errs, errors.New("flow entries must be ≥ 1"))
	}
	page := uint32(os.Getpagesize())
	if s.RingBytes < page || s.RingBytes&(s.RingBytes-1) != 0 {
		errs = append(errs, fmt.Errorf("ring buffer size %d must be a power of two ≥ the page size %d", s.RingBytes, page))
	}
	if s.Interfaces < 1 || s.Interfaces > 1<<20 {
		errs = append(errs, fmt.Errorf("interfaces %d must be in [1, %d]", s.Interfaces, 1<<20))
	}
	if c := s.CacheSlots; c != 0 && (c&(c-1) != 0 || c > 1<<16) {
		errs = append(errs, fmt.Errorf("flow cache slots %d must be a power of two ≤ 65536", c))
	}
	if s.ActiveTimeout < time.Second {
		errs = append(errs, fmt.Errorf("active timeout %s must be ≥ 1s", s.ActiveTimeout))
	}
	return errors.Join(errs...)
}

// Objects are the loaded maps and programs.
type Objects struct {
	spec  Spec
	objs  flowObjects
	ncpu  int
	meter []Meter // scratch for per-CPU lookups

	// Flow-cache generations: cur is in caches[0] (packet path), the other
	// in caches[1] (flush). flushPos > 0 or flushing: the other generation
	// still holds slots from flushPos on; it must be empty before a flip.
	cur      int
	flushing bool
	flushPos uint32
	// flushBoth: adopted state, the next Sweep merges both generations
	// before it exports: the one the packet path uses may still hold the
	// previous run's slots, and a flow split between table and slot must
	// not leave as two records.
	flushBoth bool
	cent      []FlowCent // scratch for per-CPU lookups

	// Pinning (PinDir set): where, whether the maps were adopted, and the
	// userspace bookkeeping maps.
	stateDir   string
	adopted    bool
	adoptDiffs []string
	meterState *ebpf.Map
	meterPub   *ebpf.Map
	lock       *os.File // flock on PinDir
}

// size sets spec's map sizes and load-time constants from s.
func (s Spec) size(spec *ebpf.CollectionSpec) error {
	spec.Maps[flowMapFlows4].MaxEntries = s.FlowEntries
	spec.Maps[flowMapFlows6].MaxEntries = s.flow6Entries()
	spec.Maps[flowMapRecords].MaxEntries = s.RingBytes
	spec.Maps[flowMapMeters].MaxEntries = (s.Interfaces + 1) * 2
	spec.Maps[flowMapIfSlotsBig].MaxEntries = s.Interfaces
	slots := s.cacheSlots()
	spec.Maps[flowMapCache0].MaxEntries = slots
	spec.Maps[flowMapCache1].MaxEntries = slots
	spec.Maps[flowMapCaches].InnerMap.MaxEntries = slots
	if err := spec.Variables[flowVarActiveTimeoutNs].Set(uint64(s.ActiveTimeout)); err != nil {
		return fmt.Errorf("set active_timeout_ns: %w", err)
	}
	if err := spec.Variables[flowVarCacheMask].Set(slots - 1); err != nil {
		return fmt.Errorf("set cache_mask: %w", err)
	}
	if s.NoCache {
		if err := spec.Variables[flowVarCacheOff].Set(uint8(1)); err != nil {
			return fmt.Errorf("set cache_off: %w", err)
		}
	}
	return nil
}

// Load checks the kernel, sizes the maps from s and loads everything. It
// attaches nothing.
func Load(s Spec) (*Objects, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("bpf spec: %w", err)
	}
	if err := CheckKernel(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit: %w", explain(err))
	}
	var (
		stateDir string
		adopted  bool
		diffs    []string
		lock     *os.File
	)
	if s.PinDir != "" {
		var err error
		if adopted, err = preparePinDir(s.PinDir); err != nil {
			return nil, err
		}
		if lock, err = lockPinDir(s.PinDir); err != nil {
			return nil, err
		}
		stateDir = StateDir(s.PinDir)
		if adopted {
			if diffs, err = adoptSizes(&s, stateDir); err != nil {
				lock.Close()
				return nil, err
			}
		}
	}
	spec, err := loadFlow()
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, fmt.Errorf("parse embedded flow.bpf.o: %w", err)
	}
	var opts *ebpf.CollectionOptions
	if stateDir != "" {
		for _, n := range pinnedMaps {
			spec.Maps[n].Pinning = ebpf.PinByName
		}
		opts = &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: stateDir}}
	}
	if err := s.size(spec); err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	o := &Objects{spec: s, stateDir: stateDir, adopted: adopted, adoptDiffs: diffs, lock: lock}
	if err := spec.LoadAndAssign(&o.objs, opts); err != nil {
		if lock != nil {
			lock.Close()
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			if miss := MissingCaps(); len(miss) > 0 {
				// Without CAP_PERFMON the verifier forbids pointer
				// arithmetic the programs need ("prohibited for !root"):
				// name the capability, not just the verifier's last line.
				return nil, fmt.Errorf("load flow programs: the verifier refused them: %w", permissionError(ve))
			}
			return nil, fmt.Errorf("load flow programs: verifier rejected them (kernel %s): %+v", kernelRelease(), ve)
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("load flow programs: the maps pinned in %s do not fit this version's (%w): export them with the version that made them (`tapflow agent --detach`) or discard them (`tapflow capture detach`)", stateDir, err)
		}
		return nil, fmt.Errorf("load flow programs: %w", explain(err))
	}
	if stateDir != "" {
		if err := o.userMaps(); err != nil {
			o.Close()
			return nil, err
		}
		if adopted {
			if err := o.adoptCache(); err != nil {
				o.Close()
				return nil, err
			}
		}
	}
	n, err := ebpf.PossibleCPU()
	if err != nil {
		o.Close()
		return nil, fmt.Errorf("count possible CPUs: %w", err)
	}
	o.ncpu = n
	o.meter = make([]Meter, n)
	o.cent = make([]FlowCent, n)
	return o, nil
}

// Spec returns the sizes the objects were loaded with.
func (o *Objects) Spec() Spec { return o.spec }

// Ingress is the program for tap ingress (tx), Egress for tap egress (rx).
func (o *Objects) Ingress() *ebpf.Program { return o.objs.TcIngress }

// Egress is the program for tap egress (rx).
func (o *Objects) Egress() *ebpf.Program { return o.objs.TcEgress }

// Empty is a program that does nothing, the benchmark baseline.
func (o *Objects) Empty() *ebpf.Program { return o.objs.TcEmpty }

// Records is the ring buffer map.
func (o *Objects) Records() *ebpf.Map { return o.objs.Records }

// flowCountPktShift mirrors FLOW_COUNT_PKT_SHIFT: flow_ent.count packs
// packets << 40 | bytes.
const flowCountPktShift = 40

// Val returns the record form of an entry's counters.
func (e *FlowEnt) Val() FlowVal {
	return FlowVal{
		Bytes:    e.Bytes + e.Count&(1<<flowCountPktShift-1),
		Packets:  e.Packets + e.Count>>flowCountPktShift,
		FirstNs:  e.FirstNs,
		LastNs:   e.LastNs,
		TcpFlags: e.TcpFlags,
		Dead:     e.Dead,
	}
}

// FlowEntry is one live flow-table entry, its key in record form.
type FlowEntry struct {
	Key FlowKey
	Val FlowVal
}

// Key returns the record form of an IPv4 table key (::ffff:a.b.c.d).
func (k *FlowKey4) Key() FlowKey {
	r := FlowKey{Ifindex: k.Ifindex, Direction: k.Direction, Protocol: k.Protocol, VlanId: k.VlanId,
		SrcMac: k.SrcMac, DstMac: k.DstMac, EthProto: 0x0800, SrcPort: k.SrcPort, DstPort: k.DstPort}
	r.SrcIp[10], r.SrcIp[11], r.DstIp[10], r.DstIp[11] = 0xff, 0xff, 0xff, 0xff
	copy(r.SrcIp[12:], k.SrcIp[:])
	copy(r.DstIp[12:], k.DstIp[:])
	return r
}

// Key returns the record form of an IPv6 table key.
func (k *FlowKey6) Key() FlowKey {
	return FlowKey{Ifindex: k.Ifindex, Direction: k.Direction, Protocol: k.Protocol, VlanId: k.VlanId,
		SrcMac: k.SrcMac, DstMac: k.DstMac, EthProto: 0x86dd, SrcPort: k.SrcPort, DstPort: k.DstPort,
		SrcIp: k.SrcIp, DstIp: k.DstIp}
}

// Flows lists the live entries of both flow tables (IPv4 first), with what
// the per-CPU flow caches hold for them added in (flows only in a cache
// follow). For tests and debugging: it walks the maps from userspace, not
// atomically.
func (o *Objects) Flows() ([]FlowEntry, error) {
	var out []FlowEntry
	var v FlowEnt
	var k4 FlowKey4
	it := o.objs.Flows4.Iterate()
	for it.Next(&k4, &v) {
		out = append(out, FlowEntry{k4.Key(), v.Val()})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv4 flows: %w", err)
	}
	var k6 FlowKey6
	it = o.objs.Flows6.Iterate()
	for it.Next(&k6, &v) {
		out = append(out, FlowEntry{k6.Key(), v.Val()})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv6 flows: %w", err)
	}
	at := make(map[FlowKey]int, len(out))
	for i := range out {
		at[out[i].Key] = i
	}
	err := o.cacheSlots(func(c *FlowCent) {
		k := c.FlowKey()
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, FlowEntry{Key: k, Val: FlowVal{FirstNs: c.FirstNs}})
			i = len(out) - 1
		}
		e := &out[i].Val
		e.Bytes += c.Bytes
		e.Packets += c.Packets
		e.TcpFlags |= c.TcpFlags
		e.FirstNs = min(e.FirstNs, c.FirstNs)
		e.LastNs = max(e.LastNs, c.LastNs)
	})
	return out, err
}

// FlowKey returns the record form of a cache slot's key.
func (c *FlowCent) FlowKey() FlowKey {
	if c.Kind == centV6 {
		return (*FlowKey6)(unsafe.Pointer(&c.Key[0])).Key()
	}
	return (*FlowKey4)(unsafe.Pointer(&c.Key[0])).Key()
}

// Kinds of a cache slot, as in flow.h.
const (
	centEmpty = 0
	centV6    = 2
)

// cacheSlots calls f for every occupied slot of both flow-cache
// generations on every CPU.
func (o *Objects) cacheSlots(f func(*FlowCent)) error {
	for _, m := range []*ebpf.Map{o.objs.Cache0, o.objs.Cache1} {
		for i := uint32(0); i < o.spec.cacheSlots(); i++ {
			if err := m.Lookup(i, &o.cent); err != nil {
				return fmt.Errorf("read flow cache slot %d: %w", i, err)
			}
			for c := range o.cent {
				if o.cent[c].Kind != centEmpty {
					f(&o.cent[c])
				}
			}
		}
	}
	return nil
}

// CacheBypasses counts, over every CPU, the times a CPU started to send
// packets straight to the flow table because its cache counted too few of
// the packets it probed (flow.bpf.c: CACHE_BYPASS). It starts at 0 with
// every load.
func (o *Objects) CacheBypasses() (uint64, error) {
	var st []flowCacheState
	if err := o.objs.CacheStates.Lookup(uint32(0), &st); err != nil {
		return 0, fmt.Errorf("read flow cache state: %w", err)
	}
	var n uint64
	for _, s := range st {
		n += uint64(s.Bypasses)
	}
	return n, nil
}

// CachedFlows counts the occupied flow-cache slots (both generations, all
// CPUs). Zero after a shutdown sweep: nothing is left behind in a cache.
func (o *Objects) CachedFlows() (int, error) {
	n := 0
	err := o.cacheSlots(func(*FlowCent) { n++ })
	return n, err
}

func (o *Objects) cacheMap(gen int) *ebpf.Map {
	if gen == 0 {
		return o.objs.Cache0
	}
	return o.objs.Cache1
}

// FlushCache moves every slot of the flow-cache generation the packet path
// used so far into the flow tables. It flips the generations first: an
// update of the array of maps returns only after every running program is
// done, so no packet writes the old generation while the flush program
// reads it. Deferred means the ring buffer ran low: drain it and call again;
// the old generation stays frozen (and is not flipped back) until empty.
// Not safe for concurrent use (nor with Sweep or Flows).
func (o *Objects) FlushCache() (merged uint32, deferred bool, err error) {
	if !o.flushing {
		next := 1 - o.cur
		if err := o.objs.Caches.Put(uint32(0), o.cacheMap(next)); err != nil {
			return 0, false, fmt.Errorf("flip flow cache: %w", err)
		}
		o.cur, o.flushing, o.flushPos = next, true, 0
	}
	if err := o.objs.Caches.Put(uint32(1), o.cacheMap(1-o.cur)); err != nil {
		return 0, false, fmt.Errorf("point the flush at the old flow cache: %w", err)
	}
	total := uint32(o.ncpu) * o.spec.cacheSlots()
	for o.flushPos < total {
		// bpf_loop runs at most 2^23 iterations: visit in chunks.
		in := FlushArgs{Start: o.flushPos, End: min(total, o.flushPos+flushChunk)}
		var out FlushArgs
		if _, err := o.objs.Flush.Run(&ebpf.RunOptions{Context: in, ContextOut: &out}); err != nil {
			return merged, false, fmt.Errorf("run flush program: %w", err)
		}
		merged += out.Merged
		o.flushPos = out.Next
		if out.Deferred != 0 {
			return merged, true, nil
		}
	}
	o.flushing, o.flushPos = false, 0
	return merged, false, nil
}

// flushChunk is how many (CPU, slot) positions one flush run visits.
const flushChunk = 1 << 20

// Close releases this process's handles on every kernel object. Pinned
// maps stay (Unpin removes them).
func (o *Objects) Close() error {
	var errs []error
	for _, m := range []*ebpf.Map{o.meterState, o.meterPub} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	if err := o.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close flow objects: %w", err))
	}
	if o.lock != nil {
		errs = append(errs, o.lock.Close())
		o.lock = nil
	}
	return errors.Join(errs...)
}

// AdoptedSizes lists the pinned map sizes that differ from the
// configured ones (they win until the state is detached).
func (o *Objects) AdoptedSizes() []string { return o.adoptDiffs }

// SetSlot makes frames of ifindex count into meter slot (1..Interfaces).
func (o *Objects) SetSlot(ifindex, slot uint32) error {
	if slot == 0 || slot > o.spec.Interfaces {
		return fmt.Errorf("meter slot %d out of range [1, %d]", slot, o.spec.Interfaces)
	}
	m := o.objs.IfSlots
	if ifindex >= ifSlotArrayMax {
		m = o.objs.IfSlotsBig
	}
	if err := m.Put(ifindex, slot); err != nil {
		return fmt.Errorf("set meter slot of ifindex %d: %w", ifindex, err)
	}
	return nil
}

// ClearSlot sends frames of ifindex back to the unregistered slot 0.
func (o *Objects) ClearSlot(ifindex uint32) error {
	var err error
	if ifindex >= ifSlotArrayMax {
		err = o.objs.IfSlotsBig.Delete(ifindex)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
	} else {
		err = o.objs.IfSlots.Put(ifindex, uint32(0))
	}
	if err != nil {
		return fmt.Errorf("clear meter slot of ifindex %d: %w", ifindex, err)
	}
	return nil
}

// ReadMeter sums the per-CPU meters of (slot, direction). Slot 0 is the
// bucket of unregistered interfaces. The counters only grow.
func (o *Objects) ReadMeter(slot uint32, dir Direction) (Meter, error) {
	idx := slot*2 + uint32(dir)
	if err := o.objs.Meters.Lookup(idx, &o.meter); err != nil {
		return Meter{}, fmt.Errorf("read meter slot %d %s: %w", slot, dir, err)
	}
	var sum Meter
	for i := range o.meter {
		m := &o.meter[i]
		sum.Packets += m.Packets
		sum.Bytes += m.Bytes
		sum.LostPackets += m.LostPackets
		sum.LostBytes += m.LostBytes
		sum.FailedUpdates += m.FailedUpdates
		sum.SkippedPackets += m.SkippedPackets
		sum.SkippedBytes += m.SkippedBytes
		sum.Records += m.Records
	}
	return sum, nil
}

// SweepResult reports one run of the sweep program.
type SweepResult struct {
	Now      uint64 // kernel coarse clock (ns) the sweep used
	Scanned  uint32
	Exported uint32
	Deleted  uint32
	Merged   uint32 // flow-cache slots merged into the tables first
	Deferred bool   // the ring buffer was full or max was reached: drain, run again
}

// Sweep first merges the flow cache into the tables (FlushCache; with idle
// 0 both generations), then exports (reason) and removes every flow idle
// for at least idle — all flows when idle is 0 — submitting at most max
// records. It never loses a flow: when the ring is full the rest stays in
// the cache or table and Deferred is set.
func (o *Objects) Sweep(idle time.Duration, reason EndReason, max uint32) (SweepResult, error) {
	var merged uint32
	for gen := 0; gen < 1 || ((idle == 0 || o.flushBoth) && gen < 2); gen++ {
		n, deferred, err := o.FlushCache()
		merged += n
		if err != nil {
			return SweepResult{}, err
		}
		if deferred {
			return SweepResult{Merged: merged, Deferred: true}, nil
		}
	}
	o.flushBoth = false
	now, err := MonotonicCoarse()
	if err != nil {
		return SweepResult{}, err
	}
	in := SweepArgs{IdleNs: uint64(idle), Reason: uint32(reason), MaxRecords: max, NowNs: now}
	var out SweepArgs
	if _, err := o.objs.Sweep.Run(&ebpf.RunOptions{Context: in, ContextOut: &out}); err != nil {
		return SweepResult{}, fmt.Errorf("run sweep program: %w", err)
	}
	return SweepResult{Now: now, Scanned: out.Scanned, Exported: out.Exported, Deleted: out.Deleted, Merged: merged, Deferred: out.Deferred != 0}, nil
}

// DecodeRecord views a ring-buffer sample as a FlowRecord without copying.
// ok is false when the sample is too short.
func DecodeRecord(sample []byte) (rec *FlowRecord, ok bool) {
	if len(sample) < FlowRecordSize {
		return nil, false
	}
	return (*FlowRecord)(unsafe.Pointer(&sample[0])), true
}

// MonotonicCoarse reads CLOCK_MONOTONIC_COARSE, the clock of
// bpf_ktime_get_coarse_ns and so of every kernel timestamp.
func MonotonicCoarse() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_MONOTONIC_COARSE): %w", err)
	}
	return uint64(ts.Nano()), nil
}

// explain turns permission and support errors into messages that name what
// is missing.
func explain(err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, os.ErrPermission):
		return permissionError(err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("kernel %s lacks a needed eBPF feature: %w", kernelRelease(), err)
	}
	return err
}

// CheckKernel reports, by name, the first missing kernel feature or
// privilege the capture needs.
func CheckKernel() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("kernel %s has no BTF (/sys/kernel/btf/vmlinux: %v): build it with CONFIG_DEBUG_INFO_BTF=y", kernelRelease(), err)
	}
	if err := probeFeatures(); err != nil {
		return err
	}
	return nil
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return strings.TrimRight(string(u.Release[:]), "\x00")
}
