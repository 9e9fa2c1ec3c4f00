//go:build linux

package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
)

// Record is one flow record as read from the kernel, with the interface name
// and wall-clock times resolved.
type Record struct {
	bpf.FlowRecord
	Ifname    string
	TimeStart int64 // µs since the Unix epoch, UTC
	TimeEnd   int64
}

// MeterRecord is the meter.v1 delta of one interface and direction since
// the previous one.
type MeterRecord struct {
	TimeStart, TimeEnd int64 // µs since the Unix epoch, UTC
	Ifname             string
	Direction          string // tx or rx
	Packets, Bytes     int64
	LostPackets        int64
	LostBytes          int64
	FailedUpdates      int64
	SkippedNonIP       int64
}

// Handler receives what the capture exports. Slices are reused after the
// call returns. A call may block (backpressure); an error stops Run.
//
// done must be called once, when the records (or meter deltas) are
// durable downstream — published, or in the agent spool — or given up
// (the loss is then counted downstream). Until then the flow records stay
// in the kernel ring buffer and the meter deltas are not recorded as
// published, so an agent killed meanwhile hands them over again after its
// restart (pinned state, Config.PinDir). done may be called from any
// goroutine, also after Run returned.
type Handler interface {
	Flows(ctx context.Context, recs []Record, done func()) error
	Meters(ctx context.Context, ms []MeterRecord, done func()) error
}

// Options are the collaborators of a Capture.
type Options struct {
	Logger   *slog.Logger          // nil: slog.Default()
	Registry prometheus.Registerer // nil: no metrics registered
	Handler  Handler               // required
	// Detach makes this run the last: at stop it detaches from every
	// interface before it exports every flow still in the kernel and
	// removes the pinned state (uninstall). Without pinning, or with a pin
	// that will not outlive the agent, every stop does that.
	Detach bool
}

// ackWait bounds how long a stop waits for the last records and meters
// handed over to become durable, and how long its export may wait for
// ring space; what is not acked by then stays in the ring (pinned) for
// the next run, or is counted as stranded when nothing will adopt it.
const ackWait = 30 * time.Second

// Capture is the running kernel capture. Create with New, start with Run.
type Capture struct {
	cfg    Config
	spec   bpf.Spec
	log    *slog.Logger
	h      Handler
	m      *metrics
	detach bool
	// ackWait is the const ackWait (tests shorten it before the stop).
	ackWait time.Duration

	// Owned by Run's goroutine.
	objs       *bpf.Objects
	att        *attach.Attacher
	ring       *bpf.Ring
	sample     []byte
	flushedPos uint64 // ring position of the last hand-over
	batch      []Record
	pinned     bool
	// durable: the pin directory's bpffs outlives the agent
	// (bpf.PinDurable), so a stop may leave the programs attached for
	// the next start to adopt. A pin that will not outlive the agent
	// makes every stop a detaching one.
	durable   bool
	pinWhy    atomic.Pointer[string] // non-durable pin: why (readiness note)
	ifaces    map[int]*iface
	names     map[uint32]nameEntry
	freeSlots []uint32
	offsetNs  int64 // wall ns − CLOCK_MONOTONIC_COARSE ns
	sweepMax  uint32
	bypasses  uint64 // the kernel's cache bypass count at the last sweep
	meterBuf  []MeterRecord
	// pendingMeters holds final deltas of interfaces replaced by a new one
	// with the same ifindex, until the next meter tick.
	pendingMeters []MeterRecord
	pendingSlots  []slotMeter // what pendingMeters were taken up to
	// gone are adopted slots of an ifindex another slot took over: their
	// final delta goes out with the next meters.
	gone      []*iface
	lastMeter time.Time
	// running is true from the first interface scan until Run returns
	// (the agent's /readyz: capture attached).
	running atomic.Bool
	// ExportLive's requests, served by Run's goroutine (it owns objs);
	// quit is closed when Run returns.
	exportReq chan exportReq
	quit      chan struct{}
	quitOnce  sync.Once

	// Acks of handed-over records: the ring is committed up to the end of
	// the oldest batches acked, in order.
	ackMu  sync.Mutex
	acks   []*ackEnt
	ackSig chan struct{}
	// Acks of meter deltas: the published meters of each slot.
	pubMu     sync.Mutex
	pubClosed bool
	meterAcks int         // meter batches handed over, not acked
	meterQ    []*meterEnt // in hand-over order: published advances in order
}

type meterEnt struct {
	slots []slotMeter
	done  bool
}

type ackEnt struct {
	pos  uint64
	done bool
	// What the batch carried: counted as stranded if the capture lets go
	// of the ring before its ack, with no pin to hand it over again.
	records int
	bytes   uint64
}

// slotMeter is a slot's meter reading a delta was taken up to.
type slotMeter struct {
	slot uint32
	dir  bpf.Direction
	m    bpf.Meter
	// The interface's last delta: its ack frees the pinned slot record
	// (if the slot still belongs to this ifindex and attach).
	final   bool
	ifindex uint32
	first   [2]bpf.Meter
}

type iface struct {
	index  int
	name   string
	slot   uint32
	handle *attach.Handle // nil: adopted from the pinned state, not attached yet
	base   [2]bpf.Meter   // values at the previous meter record
	first  [2]bpf.Meter   // values when attached: base − first = totals
	gone   bool
}

type nameEntry struct {
	name    string
	expires time.Time // zero while attached
}

const batchMax = 4096

// New validates cfg and opts; it starts nothing and touches no kernel state.
func New(cfg Config, opts Options) (*Capture, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("capture config: %w", err)
	}
	if opts.Handler == nil {
		return nil, errors.New("capture: a Handler is required")
	}
	spec, err := cfg.Spec(runtime.NumCPU())
	if err != nil {
		return nil, fmt.Errorf("capture sizes: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	c := &Capture{
		cfg: cfg, spec: spec, log: log.With("component", "capture"), h: opts.Handler, m: m, detach: opts.Detach || cfg.Detach,
		ifaces: map[int]*iface{}, names: map[uint32]nameEntry{},
		batch: make([]Record, 0, batchMax), pinned: cfg.PinDir != "", ackSig: make(chan struct{}, 1),
		exportReq: make(chan exportReq), quit: make(chan struct{}), ackWait: ackWait,
	}
	for s := uint32(cfg.MaxInterfaces); s >= 1; s-- {
		c.freeSlots = append(c.freeSlots, s)
	}
	c.sweepMax = spec.RingBytes / uint32(bpf.FlowRecordSize+8) / 2
	return c, nil
}

// Spec is the kernel sizing New derived from the config.
func (c *Capture) Spec() bpf.Spec { return c.spec }

// Running reports whether the programs are loaded and the interfaces
// scanned (safe from any goroutine).
func (c *Capture) Running() bool { return c.running.Load() }

// PinNote is "" unless capture.pin_dir is set and its bpffs will not
// outlive the agent; then it says why and what to change (the agent's
// /readyz shows it). Safe from any goroutine.
func (c *Capture) PinNote() string {
	if p := c.pinWhy.Load(); p != nil {
		return *p
	}
	return ""
}

// checkPin mounts the bpffs capture.pin_dir needs when none is (a host
// or container without systemd, as the unit's ExecStartPre would) and
// decides whether the pin outlives the agent. A pin that does not is
// kept for the run (a restart inside the same namespace still adopts it
// after a SIGKILL) but every stop detaches and exports as without
// pinning: leaving flows in a bpffs that goes away with the agent would
// lose them uncounted. Treating it as no pin at all would be as exact at
// a stop but would not survive a SIGKILL inside a container that
// restarts the agent in place; one stop path (shutdown) for both keeps
// the behaviour that matters — nothing stranded — in one tested place.
func (c *Capture) checkPin() error {
	c.m.pinDurable.Set(0)
	if !c.pinned {
		return nil
	}
	mounted, err := bpf.MountBPFFS(c.cfg.PinDir)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if mounted {
		c.log.Info("mounted a bpf filesystem for capture.pin_dir (none was mounted)", "path", bpf.BPFFSRoot, "pin_dir", c.cfg.PinDir, "mode", "0700")
	}
	d := bpf.PinDurable(c.cfg.PinDir, mounted)
	c.durable = d.Durable
	if !d.Durable && bpf.BelowBPFFSRoot(c.cfg.PinDir) && !bpf.OnBPFFS(c.cfg.PinDir) {
		// Nowhere to pin: no bpffs at /sys/fs/bpf, and this process may
		// not mount one (a container with CAP_BPF, CAP_NET_ADMIN and
		// CAP_PERFMON only, without the host's /sys/fs/bpf). Run as
		// without pinning, which every stop makes exact
		// (TestImage/NoBPFFS). A pin_dir elsewhere that is not on bpffs
		// stays an error (a mistake in the config).
		c.pinned = false
		c.spec.PinDir = ""
		d.Reason += ", and none can be mounted without CAP_SYS_ADMIN: running without pinning"
	}
	if !d.Durable {
		why := fmt.Sprintf("capture.pin_dir %s will not outlive the agent (%s): every stop detaches and exports all flows, and the programs do not count across a restart; bind-mount the host's /sys/fs/bpf or run the agent in the host's mount namespace (docs/operations.md)",
			c.cfg.PinDir, d.Reason)
		c.pinWhy.Store(&why)
		c.log.Warn("the pinned capture state will not outlive the agent: every stop detaches and exports everything; to keep counting across restarts, bind-mount the host's /sys/fs/bpf into the agent's mount namespace or run it in the host's",
			"pin_dir", c.cfg.PinDir, "why", d.Reason)
		return nil
	}
	c.m.pinDurable.Set(1)
	c.log.Info("capture.pin_dir outlives the agent: a stop leaves the programs attached for the next start", "pin_dir", c.cfg.PinDir, "why", d.Reason)
	return nil
}

// Run loads and attaches the programs, then drains, sweeps and meters until
// ctx is done.
//
// With pinning (Config.PinDir) it first adopts what a previous run left
// pinned: the maps (table, caches, meters, unread and unacked ring
// records), the tcx links (swapping in this run's programs) and the meter
// slots. Every stop exports every flow the kernel holds (end reason
// shutdown) and waits for it to be durable. With a pin that outlives the
// agent (bpf.PinDurable) the programs then stay attached, counting what
// crosses the taps until the next start adopts it.
//
// Without pinning, with a pin that will not outlive the agent, or with
// Options.Detach, the stop detaches first, then exports every flow left
// in the kernel, publishes the last meters and removes the pinned state.
// Handler calls during the stop get a context that is not cancelled.
func (c *Capture) Run(ctx context.Context) (err error) {
	defer c.quitOnce.Do(func() { close(c.quit) })
	if err := c.checkPin(); err != nil {
		return err
	}
	objs, err := bpf.Load(c.spec)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	c.objs = objs
	c.spec = objs.Spec()
	defer c.closeObjects()
	if d := objs.AdoptedSizes(); len(d) > 0 {
		c.log.Warn("the pinned maps keep their sizes until the capture is detached (tapflow agent --detach, then start)", "pinned", d)
	}
	c.freeSlots = c.freeSlots[:0]
	for s := c.spec.Interfaces; s >= 1; s-- {
		c.freeSlots = append(c.freeSlots, s)
	}
	c.m.tableCapacity.Set(float64(c.spec.FlowEntries + c.spec.Flow6Entries()))
	linkDir := ""
	if c.pinned {
		linkDir = bpf.LinkDir(c.cfg.PinDir)
	}
	if c.att, err = attach.New(c.cfg.AttachMode, objs.Ingress(), objs.Egress(), linkDir); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if c.ring, err = bpf.OpenRing(objs.Records()); err != nil {
		return fmt.Errorf("capture: open ring buffer: %w", err)
	}
	if err := c.syncClock(); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if objs.Adopted() {
		if err := c.adopt(); err != nil {
			return fmt.Errorf("capture: adopt pinned state: %w", err)
		}
	}
	c.log.Info("capture loaded", "flow_entries", c.spec.FlowEntries, "flow6_entries", c.spec.Flow6Entries(), "ring_bytes", c.spec.RingBytes,
		"max_interfaces", c.spec.Interfaces, "interfaces", c.cfg.Interfaces, "pin_dir", c.cfg.PinDir, "adopted", objs.Adopted(),
		"ring_unread_bytes", c.ring.Unread())

	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	subErr := make(chan error, 1)
	subscribe := func() error {
		return netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
			ErrorCallback: func(err error) {
				select {
				case subErr <- err:
				default:
				}
			},
		})
	}
	if err := subscribe(); err != nil {
		return fmt.Errorf("capture: subscribe to netlink link events: %w", err)
	}
	// Flush (or hand over) even when a step below fails.
	defer func() {
		stop := c.shutdown
		if c.pinned && c.durable && !c.detach {
			stop = c.keep
		}
		if ferr := stop(context.WithoutCancel(ctx)); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}()
	c.rescan()
	c.lastMeter = time.Now()
	c.running.Store(true)
	defer c.running.Store(false)

	poll := time.NewTicker(c.cfg.PollInterval.D())
	defer poll.Stop()
	now := time.Now()
	nextSweep := now.Add(c.cfg.SweepInterval.D())
	nextMeter := now.Add(c.cfg.MeterInterval.D())
	nextScan := now.Add(c.cfg.RescanInterval.D())
	for {
		select {
		case <-ctx.Done():
			return nil
		case req := <-c.exportReq:
			req.done <- c.exportLive(ctx, req.ctx)
		case u, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			c.linkUpdate(u)
		case err := <-subErr:
			c.log.Warn("netlink link subscription failed; relying on the rescan until it is renewed", "err", err)
			updates = make(chan netlink.LinkUpdate, 256)
			if err := subscribe(); err != nil {
				c.log.Warn("renew netlink subscription", "err", err)
			}
		case now := <-poll.C:
			if err := c.drain(ctx); err != nil {
				return err
			}
			if !now.Before(nextSweep) {
				nextSweep = now.Add(c.cfg.SweepInterval.D())
				if err := c.sweep(ctx, c.cfg.IdleTimeout.D(), bpf.EndIdleTimeout); err != nil {
					return err
				}
			}
			if !now.Before(nextMeter) {
				nextMeter = now.Add(c.cfg.MeterInterval.D())
				if err := c.meters(ctx); err != nil {
					return err
				}
			}
			if !now.Before(nextScan) {
				nextScan = now.Add(c.cfg.RescanInterval.D())
				c.rescan()
			}
		}
	}
}

// syncClock measures wall − CLOCK_MONOTONIC_COARSE.
func (c *Capture) syncClock() error {
	mono, err := bpf.MonotonicCoarse()
	if err != nil {
		return err
	}
	c.offsetNs = time.Now().UnixNano() - int64(mono)
	return nil
}

// WallMicros converts a kernel timestamp to µs since the Unix epoch.
func (c *Capture) wallMicros(ns uint64) int64 { return (int64(ns) + c.offsetNs) / 1000 }

func (c *Capture) linkUpdate(u netlink.LinkUpdate) {
	attrs := u.Link.Attrs()
	switch u.Header.Type {
	case unix.RTM_NEWLINK:
		if cur, ok := c.ifaces[attrs.Index]; ok && cur.name != attrs.Name {
			c.release(cur, "renamed") // renamed away from (or to another) glob
		}
		if c.cfg.Match(attrs.Name) {
			c.attach(attrs.Index, attrs.Name)
		}
	case unix.RTM_DELLINK:
		if cur, ok := c.ifaces[attrs.Index]; ok {
			c.release(cur, "vanished")
		}
	}
}

// rescan lists interfaces: attaches to matching ones not attached, releases
// attached ones that are gone. It also removes cls_bpf filters a crashed
// run left on interfaces it is about to attach to.
func (c *Capture) rescan() {
	links, err := netlink.LinkList()
	if err != nil {
		c.log.Warn("list interfaces", "err", err)
		return
	}
	present := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		present[a.Index] = a.Name
		if c.cfg.Match(a.Name) {
			c.attach(a.Index, a.Name)
		}
	}
	for idx, ifc := range c.ifaces {
		if !ifc.gone && present[idx] != ifc.name {
			c.release(ifc, "missing at rescan")
		} else if !ifc.gone && ifc.handle == nil && !c.cfg.Match(ifc.name) {
			c.release(ifc, "adopted but no longer matching capture.interfaces")
		}
	}
}

func (c *Capture) attach(index int, name string) {
	ifc, ok := c.ifaces[index]
	if ok && !ifc.gone && ifc.handle == nil && ifc.name == name {
		c.attachAdopted(ifc)
		return
	}
	if ok && !ifc.gone && ifc.handle == nil {
		// Adopted for an interface of another name: that one is gone.
		c.release(ifc, "replaced while the agent was down")
	}
	if ok && !ifc.gone && ifc.handle != nil {
		return
	} else if ok {
		// The same ifindex is back before the old interface's last meter
		// record: take its final delta now (published with the next
		// meters) so no metered byte is lost, and free its slot.
		if err := c.takeMeters(ifc, c.lastMeter.UnixMicro(), time.Now(), &c.pendingMeters, &c.pendingSlots, true); err != nil {
			c.log.Error("final meter of a replaced interface", "ifname", ifc.name, "err", err)
		}
		c.finalMeter(ifc, false)
		delete(c.ifaces, index)
	}
	if len(c.freeSlots) == 0 {
		c.m.attachFailures.Inc()
		c.log.Error("cannot attach: max_interfaces reached", "ifname", name, "max_interfaces", c.cfg.MaxInterfaces)
		return
	}
	if !c.pinned {
		// With pinning cls_bpf filters of a previous run are replaced
		// in place (FilterReplace: no gap) instead.
		if n, err := attach.RemoveStale(index); err != nil {
			c.log.Warn("remove stale filters", "ifname", name, "err", err)
		} else if n > 0 {
			c.log.Info("removed filters left by a previous run", "ifname", name, "count", n)
		}
	}
	slot := c.freeSlots[len(c.freeSlots)-1]
	ifc = &iface{index: index, name: name, slot: slot}
	for d := range 2 {
		m, err := c.objs.ReadMeter(slot, bpf.Direction(d))
		if err != nil {
			c.log.Error("read meter baseline", "ifname", name, "err", err)
			c.m.attachFailures.Inc()
			return
		}
		ifc.base[d] = m
		ifc.first[d] = m
	}
	if err := c.recordSlot(ifc); err != nil {
		c.log.Error("record meter slot", "ifname", name, "err", err)
		c.m.attachFailures.Inc()
		return
	}
	if err := c.objs.SetSlot(uint32(index), slot); err != nil {
		c.log.Error("register interface", "ifname", name, "err", err)
		c.m.attachFailures.Inc()
		return
	}
	h, err := c.att.Attach(index, name)
	if err != nil {
		c.objs.ClearSlot(uint32(index))
		c.m.attachFailures.Inc()
		// An interface that vanished mid-attach is normal churn.
		c.log.Warn("attach", "ifname", name, "ifindex", index, "err", err)
		return
	}
	c.freeSlots = c.freeSlots[:len(c.freeSlots)-1]
	ifc.handle = h
	c.ifaces[index] = ifc
	c.names[uint32(index)] = nameEntry{name: name}
	c.m.attached.Inc()
	c.m.preset(name)
	c.log.Info("attached", "ifname", name, "ifindex", index, "mode", h.Mode, "slot", slot)
}

// release detaches now and frees the slot at the next meter tick, after
// the last delta has been taken.
func (c *Capture) release(ifc *iface, why string) {
	if ifc.gone {
		return
	}
	if ifc.handle != nil {
		if err := ifc.handle.Close(); err != nil {
			c.log.Debug("detach", "ifname", ifc.name, "err", err)
		}
		c.m.attached.Dec()
	} else if c.pinned {
		// Adopted but never attached by this run: drop its stale pins.
		for _, d := range []string{"ingress", "egress"} {
			os.Remove(attach.PinPath(bpf.LinkDir(c.cfg.PinDir), ifc.index, d))
		}
	}
	ifc.gone = true
	// Keep the name while flows of the interface may still be swept.
	c.names[uint32(ifc.index)] = nameEntry{name: ifc.name, expires: time.Now().Add(2*c.cfg.IdleTimeout.D() + 2*c.cfg.SweepInterval.D())}
	c.log.Info("released", "ifname", ifc.name, "ifindex", ifc.index, "why", why)
}

func (c *Capture) ifname(ifindex uint32) string {
	if e, ok := c.names[ifindex]; ok {
		return e.name
	}
	// Not attached by this run (slot-0 traffic): remember a synthetic name.
	n := fmt.Sprintf("ifindex%d", ifindex)
	c.names[ifindex] = nameEntry{name: n, expires: time.Now().Add(2 * c.cfg.IdleTimeout.D())}
	return n
}

// drain hands every record in the ring buffer to the handler. The ring
// is committed (its space given back) only as batches are acked.
func (c *Capture) drain(ctx context.Context) error {
	for {
		sample, ok, err := c.ring.Read(c.sample)
		c.sample = sample
		if err != nil {
			return fmt.Errorf("capture: read ring buffer: %w", err)
		}
		if !ok {
			// Nothing more, or the next record is still being written
			// (reserved, not submitted): the next poll takes it.
			return c.flush(ctx)
		}
		fr, ok := bpf.DecodeRecord(sample)
		if !ok {
			c.log.Error("short ring-buffer record", "bytes", len(sample))
			continue
		}
		c.batch = append(c.batch, Record{
			FlowRecord: *fr,
			Ifname:     c.ifname(fr.Key.Ifindex),
			TimeStart:  c.wallMicros(fr.Val.FirstNs),
			TimeEnd:    c.wallMicros(fr.Val.LastNs),
		})
		if r := fr.EndReason; int(r) < len(c.m.records) && c.m.records[r] != nil {
			c.m.records[r].Inc()
		}
		if len(c.batch) == batchMax {
			if err := c.flush(ctx); err != nil {
				return err
			}
		}
	}
}

// flush hands the batch over; its ack commits the ring up to the read
// position (once every older batch is acked too).
func (c *Capture) flush(ctx context.Context) error {
	pos := c.ring.Pos()
	if len(c.batch) == 0 && pos == c.flushedPos {
		return nil
	}
	c.flushedPos = pos
	c.m.unacked.Set(float64(c.ring.Uncommitted()))
	e := &ackEnt{pos: pos, records: len(c.batch)}
	for i := range c.batch {
		e.bytes += c.batch[i].Val.Bytes
	}
	c.ackMu.Lock()
	if len(c.batch) == 0 {
		// Nothing to hand over, but the read position may have moved
		// (discarded samples): commit in order.
		e.done = true
	}
	c.acks = append(c.acks, e)
	c.ackMu.Unlock()
	if len(c.batch) == 0 {
		c.ackDone(e)
		return nil
	}
	err := c.h.Flows(ctx, c.batch, func() { c.ackDone(e) })
	c.batch = c.batch[:0]
	if err != nil {
		return fmt.Errorf("capture: hand over flow records: %w", err)
	}
	return nil
}

// ackDone marks e acked and commits the ring past every acked batch at
// the head of the queue.
func (c *Capture) ackDone(e *ackEnt) {
	c.ackMu.Lock()
	e.done = true
	var pos uint64
	n := 0
	for n < len(c.acks) && c.acks[n].done {
		pos = c.acks[n].pos
		n++
	}
	if n > 0 {
		clear(c.acks[:n])
		c.acks = c.acks[n:]
		c.ring.Commit(pos)
	}
	c.ackMu.Unlock()
	select {
	case c.ackSig <- struct{}{}:
	default:
	}
}

// unacked counts batches (flows and meters) handed over and not acked.
func (c *Capture) unacked() int {
	c.ackMu.Lock()
	n := len(c.acks)
	c.ackMu.Unlock()
	c.pubMu.Lock()
	n += c.meterAcks
	c.pubMu.Unlock()
	return n
}

// waitAcks waits until everything handed over is acked, up to d.
func (c *Capture) waitAcks(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for c.unacked() > 0 {
		select {
		case <-c.ackSig:
		case <-time.After(10 * time.Millisecond):
		case <-deadline.C:
			return c.unacked() == 0
		}
	}
	return true
}

// countBypasses adds the flow cache's bypasses since the last sweep to
// tapflow_capture_flow_cache_bypasses_total. A metric only: a failed read
// is logged at debug and tried again at the next sweep.
func (c *Capture) countBypasses() {
	n, err := c.objs.CacheBypasses()
	if err != nil {
		c.log.Debug("flow cache bypasses not counted", "err", err)
		return
	}
	if n > c.bypasses {
		c.m.cacheBypasses.Add(float64(n - c.bypasses))
	}
	c.bypasses = n
}

// sweep runs the sweep program until it is not deferred, draining between
// runs.
func (c *Capture) sweep(ctx context.Context, idle time.Duration, reason bpf.EndReason) error {
	return c.sweepUntil(ctx, context.Background(), idle, reason)
}

// sweepUntil is sweep; a full export (EndInventoryChange, EndShutdown)
// runs until everything is out or until is done.
func (c *Capture) sweepUntil(ctx, until context.Context, idle time.Duration, reason bpf.EndReason) error {
	for i := 0; ; i++ {
		res, err := c.objs.Sweep(idle, reason, c.sweepMax)
		if err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		c.m.cacheMerged.Add(float64(res.Merged))
		if i == 0 {
			c.countBypasses()
		}
		if res.Scanned > 0 || !res.Deferred {
			c.m.tableEntries.Set(float64(res.Scanned - res.Deleted))
		}
		if err := c.drain(ctx); err != nil {
			return err
		}
		if !res.Deferred {
			return nil
		}
		c.m.sweepDeferred.Inc()
		full := reason == bpf.EndShutdown || reason == bpf.EndInventoryChange
		if i >= 1000 && !full {
			return nil // try again at the next interval
		}
		if full {
			if err := until.Err(); err != nil {
				return err // the rest stays in the table
			}
		}
		if full && c.ring.Uncommitted() > 0 {
			// The ring is full of records handed over but not yet
			// durable: their acks make room.
			select {
			case <-c.ackSig:
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

// ErrNotRunning: ExportLive was called while Run is not capturing.
var ErrNotRunning = errors.New("capture not running")

type exportReq struct {
	ctx  context.Context
	done chan error // buffered: Run never blocks on a gone caller
}

// ExportLive exports every flow the kernel holds — the flow tables and
// both per-CPU flow-cache generations — through the ordinary ring and
// handler path, end reason inventory_change, and returns once the last of
// them has been handed to the Handler (not when it is durable). Each flow
// is split at the export: its next packets start a new record. Nothing is
// counted twice or lost, as with every other export (the entry's claim,
// then atomic exchanges; the cache flip waits for running programs).
//
// It runs in Run's goroutine between two polls, so it blocks while the
// Handler blocks (backpressure). When ctx ends first ExportLive returns
// ctx's error; flows not exported yet stay in the kernel and leave it as
// usual. It returns ErrNotRunning when Run is not capturing.
func (c *Capture) ExportLive(ctx context.Context) error {
	if !c.running.Load() {
		return ErrNotRunning
	}
	req := exportReq{ctx: ctx, done: make(chan error, 1)}
	select {
	case c.exportReq <- req:
	case <-c.quit:
		return ErrNotRunning
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exportLive serves one ExportLive: everything the ring holds goes first
// (older records keep their order), then a sweep of every flow.
func (c *Capture) exportLive(ctx, until context.Context) error {
	start := time.Now()
	if err := c.drain(ctx); err != nil {
		return err
	}
	if err := c.sweepUntil(ctx, until, 0, bpf.EndInventoryChange); err != nil {
		return fmt.Errorf("capture: export live flows: %w", err)
	}
	if err := c.drain(ctx); err != nil {
		return err
	}
	c.m.exports.Inc()
	c.m.exportSeconds.Observe(time.Since(start).Seconds())
	return nil
}

// meters publishes one delta per interface and direction.
func (c *Capture) meters(ctx context.Context) error {
	now := time.Now()
	start := c.lastMeter.UnixMicro()
	c.lastMeter = now
	// Final deltas of interfaces whose ifindex came back before this tick
	// (taken in attach) go out first.
	c.meterBuf = append(c.meterBuf[:0], c.pendingMeters...)
	slots := append([]slotMeter(nil), c.pendingSlots...)
	c.pendingMeters, c.pendingSlots = c.pendingMeters[:0], c.pendingSlots[:0]
	for _, ifc := range c.gone {
		if err := c.takeMeters(ifc, start, now, &c.meterBuf, &slots, true); err != nil {
			return err
		}
		c.finalMeter(ifc, false)
	}
	c.gone = c.gone[:0]
	for idx, ifc := range c.ifaces {
		if err := c.takeMeters(ifc, start, now, &c.meterBuf, &slots, ifc.gone); err != nil {
			return err
		}
		if ifc.gone {
			c.finalMeter(ifc, true)
			delete(c.ifaces, idx)
		}
	}
	for idx, e := range c.names {
		if !e.expires.IsZero() && now.After(e.expires) {
			delete(c.names, idx)
		}
	}
	if len(c.meterBuf) == 0 {
		return nil
	}
	e := &meterEnt{slots: slots}
	c.pubMu.Lock()
	c.meterAcks++
	c.meterQ = append(c.meterQ, e)
	c.pubMu.Unlock()
	var once sync.Once
	if err := c.h.Meters(ctx, c.meterBuf, func() { once.Do(func() { c.meterDone(e) }) }); err != nil {
		return fmt.Errorf("capture: hand over meters: %w", err)
	}
	return nil
}

// meterDone records, once a meter batch and every older one are durable,
// the readings they were taken up to as the slots' published meters: a
// restarted agent publishes from there. (Out of order, a newer reading
// would hide an older delta a kill then loses.) A final delta's ack frees
// the slot's pinned record.
func (c *Capture) meterDone(e *meterEnt) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	c.meterAcks--
	e.done = true
	n := 0
	for n < len(c.meterQ) && c.meterQ[n].done {
		n++
	}
	ready := c.meterQ[:n:n]
	c.meterQ = c.meterQ[n:]
	if c.pubClosed || !c.pinned {
		return
	}
	for _, e := range ready {
		c.publishedLocked(e.slots)
	}
}

func (c *Capture) publishedLocked(slots []slotMeter) {
	for _, s := range slots {
		pub, err := c.objs.PublishedMeter(s.slot, s.dir)
		if err != nil {
			c.log.Warn("record published meter", "err", err)
			continue
		}
		if newer(s.m, pub) {
			if err := c.objs.SetPublishedMeter(s.slot, s.dir, s.m); err != nil {
				c.log.Warn("record published meter", "err", err)
			}
		}
		if s.final && s.dir == bpf.DirRX {
			st, err := c.objs.MeterSlotState(s.slot)
			if err == nil && st.Used == 1 && st.Ifindex == s.ifindex && st.First == s.first {
				st.Used = 0
				if err := c.objs.SetMeterSlotState(s.slot, &st); err != nil {
					c.log.Warn("free pinned meter slot", "err", err)
				}
			}
		}
	}
}

// newer: meter readings only grow; a late ack of an older reading (or of
// the slot's previous owner) must not move the published meter back.
func newer(a, b bpf.Meter) bool {
	return a.Packets+a.SkippedPackets+a.LostPackets >= b.Packets+b.SkippedPackets+b.LostPackets && a != b
}

// takeMeters appends the delta of both directions of ifc since its last
// meter record to buf, the readings to sm, and moves its baseline. final:
// the interface is gone, this is its last delta.
func (c *Capture) takeMeters(ifc *iface, start int64, now time.Time, buf *[]MeterRecord, sm *[]slotMeter, final bool) error {
	for d := range 2 {
		cur, err := c.objs.ReadMeter(ifc.slot, bpf.Direction(d))
		if err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		*sm = append(*sm, slotMeter{slot: ifc.slot, dir: bpf.Direction(d), m: cur, final: final, ifindex: uint32(ifc.index), first: ifc.first})
		b := ifc.base[d]
		ifc.base[d] = cur
		r := MeterRecord{
			TimeStart: start, TimeEnd: now.UnixMicro(), Ifname: ifc.name, Direction: bpf.Direction(d).String(),
			Packets: int64(cur.Packets - b.Packets), Bytes: int64(cur.Bytes - b.Bytes),
			LostPackets: int64(cur.LostPackets - b.LostPackets), LostBytes: int64(cur.LostBytes - b.LostBytes),
			FailedUpdates: int64(cur.FailedUpdates - b.FailedUpdates), SkippedNonIP: int64(cur.SkippedPackets - b.SkippedPackets),
		}
		c.m.addMeter(&r)
		*buf = append(*buf, r)
	}
	return nil
}

// finalMeter returns a released interface's slot.
// finalMeter logs ifc's totals and frees its slot. clearSlot is false when
// the same ifindex is being registered again (clearing would unregister
// the new interface).
func (c *Capture) finalMeter(ifc *iface, clearSlot bool) {
	// The interface's whole life in one line per direction, so a run can be
	// checked for conservation from its log (Σ record bytes = bytes).
	for d := range 2 {
		t, f := ifc.base[d], ifc.first[d]
		c.log.Info("interface meter totals", "ifname", ifc.name, "direction", bpf.Direction(d).String(),
			"packets", t.Packets-f.Packets, "bytes", t.Bytes-f.Bytes,
			"lost_packets", t.LostPackets-f.LostPackets, "lost_bytes", t.LostBytes-f.LostBytes,
			"failed_updates", t.FailedUpdates-f.FailedUpdates, "skipped_non_ip", t.SkippedPackets-f.SkippedPackets)
	}
	if clearSlot {
		if err := c.objs.ClearSlot(uint32(ifc.index)); err != nil {
			c.log.Warn("unregister interface", "ifname", ifc.name, "err", err)
		}
	}
	c.freeSlots = append(c.freeSlots, ifc.slot)
	c.m.forget(ifc.name)
}

// shutdown detaches everything, exports every flow left in the kernel as a
// shutdown record and publishes the last meters. Detaching first makes
// the stop exact: no packet is counted after the last meter reading.
// With a pin that outlives the agent (a --detach stop) an incomplete
// export keeps the pinned state for another run; otherwise what the stop
// lets go of is counted as stranded.
func (c *Capture) shutdown(ctx context.Context) error {
	start := time.Now()
	for _, ifc := range c.ifaces {
		c.release(ifc, "shutdown")
	}
	until, cancel := context.WithTimeout(context.Background(), c.ackWait)
	defer cancel()
	var errs []error
	if err := c.sweepUntil(ctx, until, 0, bpf.EndShutdown); err != nil {
		errs = append(errs, err)
	}
	if err := c.drain(ctx); err != nil {
		errs = append(errs, err)
	}
	exported := time.Since(start)
	if err := c.meters(ctx); err != nil {
		errs = append(errs, err)
	}
	acked := c.waitAcks(c.ackWait)
	switch {
	case c.pinned && c.durable && len(errs) > 0:
		errs = append(errs, fmt.Errorf("capture: pinned state in %s kept: the flush failed", c.cfg.PinDir))
	case c.pinned && c.durable && !acked:
		errs = append(errs, fmt.Errorf("capture: pinned state in %s kept: records not durable within %s stay in its ring; run --detach again once the downstream is back", c.cfg.PinDir, c.ackWait))
	default:
		if len(errs) > 0 || !acked {
			c.strand(len(errs) > 0)
		}
		if c.pinned {
			if err := c.objs.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("capture: remove pinned state: %w", err))
			} else {
				c.log.Info("pinned capture state removed", "pin_dir", c.cfg.PinDir)
			}
		}
	}
	c.log.Info("capture stopped: detached, all flows exported", "export_seconds", exported.Seconds(), "acked", acked)
	return errors.Join(errs...)
}

// strand counts what a stop lets go of with nothing to adopt it: the
// records of batches handed over and not acked (the ring's copy goes
// with the process; downstream may still deliver them late) and, when
// the export failed (held), the flows still in the tables and caches.
func (c *Capture) strand(held bool) {
	var recs int
	var bytes uint64
	c.ackMu.Lock()
	for _, e := range c.acks {
		if !e.done {
			recs += e.records
			bytes += e.bytes
		}
	}
	c.ackMu.Unlock()
	if held {
		n, b, err := c.objs.Held()
		if err != nil {
			c.log.Error("count the flows left in the kernel", "err", err)
		}
		recs += n
		bytes += b
	}
	if recs == 0 {
		return
	}
	c.m.strandedRecords.Add(float64(recs))
	c.m.strandedBytes.Add(float64(bytes))
	c.log.Error("flow records left behind at stop with nothing to adopt them (tapflow_capture_stranded_*)",
		"records", recs, "bytes", bytes, "wait", c.ackWait.String(), "ring_unread_bytes", c.ring.Unread())
}

// keep is the stop with a pin that outlives the agent: export every flow
// the kernel holds (tables and every CPU's flow cache, end reason
// shutdown) while the programs keep counting, hand over the last meter
// deltas, wait until all of it is durable, and leave the programs attached
// and the state pinned: the next start adopts what crosses the taps
// meanwhile. Packets counted during the export's few milliseconds are in
// this stop's meter delta and in the next run's records.
func (c *Capture) keep(ctx context.Context) error {
	start := time.Now()
	until, cancel := context.WithTimeout(context.Background(), c.ackWait)
	defer cancel()
	var errs []error
	if err := c.drain(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := c.sweepUntil(ctx, until, 0, bpf.EndShutdown); errors.Is(err, context.DeadlineExceeded) {
		c.log.Warn("the stop's export waited for ring space longer than the ack wait: the rest stays in the pinned table for the next start",
			"wait", c.ackWait.String())
	} else if err != nil {
		errs = append(errs, err)
	}
	exported := time.Since(start)
	if err := c.meters(ctx); err != nil {
		errs = append(errs, err)
	}
	if !c.waitAcks(c.ackWait) {
		c.log.Warn("handed-over records not durable at stop: they stay in the pinned ring and the next run hands them over again",
			"wait", c.ackWait.String(), "ring_unacked_bytes", c.ring.Uncommitted())
	}
	for _, ifc := range c.ifaces {
		if ifc.handle != nil {
			if err := ifc.handle.Keep(); err != nil {
				errs = append(errs, fmt.Errorf("capture: %w", err))
			}
			ifc.handle = nil
		}
	}
	n, _, _ := c.objs.Held()
	c.log.Info("capture stopped: all flows exported; programs stay attached and counting, state pinned for the next start", "pin_dir", c.cfg.PinDir,
		"export_seconds", exported.Seconds(), "flows_since_export", n, "ring_unread_bytes", c.ring.Unread())
	return errors.Join(errs...)
}

// closeObjects ends Run: late acks after it change nothing (what they
// would have committed is handed over again by the next run).
func (c *Capture) closeObjects() {
	c.pubMu.Lock()
	c.pubClosed = true
	c.pubMu.Unlock()
	if c.ring != nil {
		c.ring.Close()
	}
	c.objs.Close()
}

// Close releases what Run left; Run releases everything itself, so this
// is for the lifecycle shape. It never detaches: with pinning the
// programs stay attached (Options.Detach removes them at Run's stop).
func (c *Capture) Close() error { return nil }

// adopt rebuilds the interface bookkeeping from the pinned state: every
// slot a previous run owned becomes an interface to attach (adopting its
// pinned link) with that run's first meters and its published ones as the
// baseline, so the next delta covers everything since the last durable
// one.
func (c *Capture) adopt() error {
	used := map[uint32]bool{}
	for slot := uint32(1); slot <= c.spec.Interfaces; slot++ {
		st, err := c.objs.MeterSlotState(slot)
		if err != nil {
			return err
		}
		if st.Used == 0 {
			if st.Ifindex != 0 {
				// A released interface: its flows may still be swept.
				if _, ok := c.names[st.Ifindex]; !ok {
					c.names[st.Ifindex] = nameEntry{name: st.IfName(), expires: time.Now().Add(2*c.cfg.IdleTimeout.D() + 2*c.cfg.SweepInterval.D())}
				}
			}
			continue
		}
		ifc := &iface{index: int(st.Ifindex), name: st.IfName(), slot: slot, first: st.First}
		for d := range 2 {
			if ifc.base[d], err = c.objs.PublishedMeter(slot, bpf.Direction(d)); err != nil {
				return err
			}
		}
		if old, ok := c.ifaces[ifc.index]; ok {
			// Two slots of one ifindex (a replaced interface): the
			// older one is gone.
			if old.slot > slot {
				old, ifc = ifc, old
			}
			old.gone = true
			c.gone = append(c.gone, old)
		}
		c.ifaces[ifc.index] = ifc
		c.names[uint32(ifc.index)] = nameEntry{name: ifc.name}
		used[slot] = true
	}
	free := c.freeSlots[:0]
	for _, s := range c.freeSlots {
		if !used[s] {
			free = append(free, s)
		}
	}
	c.freeSlots = free
	c.log.Info("adopted pinned capture state", "pin_dir", c.cfg.PinDir, "interfaces", len(used),
		"ring_unread_bytes", c.ring.Unread())
	return nil
}

// attachAdopted attaches to an interface of the pinned state (adopting its
// pinned link: this run's programs replace the old ones atomically).
func (c *Capture) attachAdopted(ifc *iface) {
	if err := c.objs.SetSlot(uint32(ifc.index), ifc.slot); err != nil {
		c.log.Error("register interface", "ifname", ifc.name, "err", err)
		c.m.attachFailures.Inc()
		return
	}
	h, err := c.att.Attach(ifc.index, ifc.name)
	if err != nil {
		c.m.attachFailures.Inc()
		c.log.Warn("attach", "ifname", ifc.name, "ifindex", ifc.index, "err", err)
		return
	}
	ifc.handle = h
	c.m.attached.Inc()
	c.m.adopted.Inc()
	c.m.preset(ifc.name)
	c.log.Info("attached", "ifname", ifc.name, "ifindex", ifc.index, "mode", h.Mode, "slot", ifc.slot, "adopted", true, "link_adopted", h.Adopted)
}

// recordSlot writes a new attachment's slot to the pinned state.
func (c *Capture) recordSlot(ifc *iface) error {
	if !c.pinned {
		return nil
	}
	st := bpf.MeterState{Ifindex: uint32(ifc.index), Used: 1, First: ifc.first}
	copy(st.Name[:], ifc.name)
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	for d := range 2 {
		if err := c.objs.SetPublishedMeter(ifc.slot, bpf.Direction(d), ifc.first[d]); err != nil {
			return err
		}
	}
	return c.objs.SetMeterSlotState(ifc.slot, &st)
}
