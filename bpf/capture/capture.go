//go:build linux

package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/cilium/ebpf/ringbuf"
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
type Handler interface {
	Flows(ctx context.Context, recs []Record) error
	Meters(ctx context.Context, ms []MeterRecord) error
}

// Options are the collaborators of a Capture.
type Options struct {
	Logger   *slog.Logger         // nil: slog.Default()
	Registry *prometheus.Registry // nil: no metrics registered
	Handler  Handler              // required
}

// Capture is the running kernel capture. Create with New, start with Run.
type Capture struct {
	cfg  Config
	spec bpf.Spec
	log  *slog.Logger
	h    Handler
	m    *metrics

	// Owned by Run's goroutine.
	objs      *bpf.Objects
	att       *attach.Attacher
	rd        *ringbuf.Reader
	rec       ringbuf.Record
	batch     []Record
	ifaces    map[int]*iface
	names     map[uint32]nameEntry
	freeSlots []uint32
	offsetNs  int64 // wall ns − CLOCK_MONOTONIC_COARSE ns
	sweepMax  uint32
	meterBuf  []MeterRecord
	// pendingMeters holds final deltas of interfaces replaced by a new one
	// with the same ifindex, until the next meter tick.
	pendingMeters []MeterRecord
	lastMeter     time.Time
}

type iface struct {
	index  int
	name   string
	slot   uint32
	handle *attach.Handle
	base   [2]bpf.Meter // values at the previous meter record
	first  [2]bpf.Meter // values when attached: base − first = totals
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
		cfg: cfg, spec: spec, log: log.With("component", "capture"), h: opts.Handler, m: m,
		ifaces: map[int]*iface{}, names: map[uint32]nameEntry{},
		batch: make([]Record, 0, batchMax),
	}
	for s := uint32(cfg.MaxInterfaces); s >= 1; s-- {
		c.freeSlots = append(c.freeSlots, s)
	}
	c.sweepMax = spec.RingBytes / uint32(bpf.FlowRecordSize+8) / 2
	return c, nil
}

// Spec is the kernel sizing New derived from the config.
func (c *Capture) Spec() bpf.Spec { return c.spec }

// Run loads and attaches the programs, then drains, sweeps and meters until
// ctx is done; then it detaches, flushes every flow left in the kernel as a
// shutdown record, publishes the last meters and returns. Handler calls
// during that flush get a context that is not cancelled.
func (c *Capture) Run(ctx context.Context) (err error) {
	objs, err := bpf.Load(c.spec)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	c.objs = objs
	defer objs.Close()
	c.m.tableCapacity.Set(float64(c.spec.FlowEntries + c.spec.Flow6Entries()))
	if c.att, err = attach.New(c.cfg.AttachMode, objs.Ingress(), objs.Egress()); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if c.rd, err = ringbuf.NewReader(objs.Records()); err != nil {
		return fmt.Errorf("capture: open ring buffer: %w", err)
	}
	defer c.rd.Close()
	if err := c.syncClock(); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	c.log.Info("capture loaded", "flow_entries", c.spec.FlowEntries, "flow6_entries", c.spec.Flow6Entries(), "ring_bytes", c.spec.RingBytes,
		"max_interfaces", c.spec.Interfaces, "interfaces", c.cfg.Interfaces)

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
	// Flush even when a step below fails.
	defer func() {
		if ferr := c.shutdown(context.WithoutCancel(ctx)); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}()
	c.rescan()
	c.lastMeter = time.Now()

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
		}
	}
}

func (c *Capture) attach(index int, name string) {
	if ifc, ok := c.ifaces[index]; ok && !ifc.gone {
		return
	} else if ok {
		// The same ifindex is back before the old interface's last meter
		// record: take its final delta now (published with the next
		// meters) so no metered byte is lost, and free its slot.
		if err := c.takeMeters(ifc, c.lastMeter.UnixMicro(), time.Now(), &c.pendingMeters); err != nil {
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
	if n, err := attach.RemoveStale(index); err != nil {
		c.log.Warn("remove stale filters", "ifname", name, "err", err)
	} else if n > 0 {
		c.log.Info("removed filters left by a previous run", "ifname", name, "count", n)
	}
	slot := c.freeSlots[len(c.freeSlots)-1]
	ifc := &iface{index: index, name: name, slot: slot}
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
	c.log.Info("attached", "ifname", name, "ifindex", index, "mode", h.Mode, "slot", slot)
}

// release detaches now and frees the slot at the next meter tick, after
// the last delta has been taken.
func (c *Capture) release(ifc *iface, why string) {
	if ifc.gone {
		return
	}
	if err := ifc.handle.Close(); err != nil {
		c.log.Debug("detach", "ifname", ifc.name, "err", err)
	}
	ifc.gone = true
	c.m.attached.Dec()
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

// drain hands every record in the ring buffer to the handler.
func (c *Capture) drain(ctx context.Context) error {
	for c.rd.AvailableBytes() > 0 {
		// A past deadline: read what is there, never wait (a deadline under
		// 1 ms would make cilium/ebpf busy-spin in epoll).
		c.rd.SetDeadline(time.Unix(1, 0))
		for {
			err := c.rd.ReadInto(&c.rec)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return fmt.Errorf("capture: read ring buffer: %w", err)
			}
			fr, ok := bpf.DecodeRecord(c.rec.RawSample)
			if !ok {
				c.log.Error("short ring-buffer record", "bytes", len(c.rec.RawSample))
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
	return c.flush(ctx)
}

func (c *Capture) flush(ctx context.Context) error {
	if len(c.batch) == 0 {
		return nil
	}
	err := c.h.Flows(ctx, c.batch)
	c.batch = c.batch[:0]
	if err != nil {
		return fmt.Errorf("capture: hand over flow records: %w", err)
	}
	return nil
}

// sweep runs the sweep program until it is not deferred, draining between
// runs.
func (c *Capture) sweep(ctx context.Context, idle time.Duration, reason bpf.EndReason) error {
	for i := 0; ; i++ {
		res, err := c.objs.Sweep(idle, reason, c.sweepMax)
		if err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		c.m.cacheMerged.Add(float64(res.Merged))
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
		if i >= 1000 && reason != bpf.EndShutdown {
			return nil // try again at the next interval
		}
	}
}

// meters publishes one delta per interface and direction.
func (c *Capture) meters(ctx context.Context) error {
	now := time.Now()
	start := c.lastMeter.UnixMicro()
	c.lastMeter = now
	// Final deltas of interfaces whose ifindex came back before this tick
	// (taken in attach) go out first.
	c.meterBuf = append(c.meterBuf[:0], c.pendingMeters...)
	c.pendingMeters = c.pendingMeters[:0]
	for idx, ifc := range c.ifaces {
		if err := c.takeMeters(ifc, start, now, &c.meterBuf); err != nil {
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
	if err := c.h.Meters(ctx, c.meterBuf); err != nil {
		return fmt.Errorf("capture: hand over meters: %w", err)
	}
	return nil
}

// takeMeters appends the delta of both directions of ifc since its last
// meter record to buf and moves its baseline.
func (c *Capture) takeMeters(ifc *iface, start int64, now time.Time, buf *[]MeterRecord) error {
	for d := range 2 {
		cur, err := c.objs.ReadMeter(ifc.slot, bpf.Direction(d))
		if err != nil {
			return fmt.Errorf("capture: %w", err)
		}
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
// shutdown record and publishes the last meters.
func (c *Capture) shutdown(ctx context.Context) error {
	for _, ifc := range c.ifaces {
		c.release(ifc, "shutdown")
	}
	var errs []error
	if err := c.sweep(ctx, 0, bpf.EndShutdown); err != nil {
		errs = append(errs, err)
	}
	if err := c.drain(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := c.meters(ctx); err != nil {
		errs = append(errs, err)
	}
	c.log.Info("capture stopped: all flows flushed")
	return errors.Join(errs...)
}
