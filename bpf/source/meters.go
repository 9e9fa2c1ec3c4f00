//go:build linux

package source

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// MeterFeed is the source of the agent's meter pipeline
// (pipeline.SourceOf[schemas.Meter]). The capture hands it meter deltas
// through Add (wire it as Options.Meters); Run forwards them downstream as
// batches of meter.v1 records.
//
// Add never blocks the capture: deltas wait in memory, and while they wait
// (downstream slow, NATS down) a new delta of the same tap and direction is
// merged into the waiting one — counters summed, interval widened — so
// memory is bounded by the number of taps, not the length of the outage,
// and sums stay exact. A batch acked with an error is merged back and
// retried a second later; only what is still waiting when Run returns is
// lost, and that is logged and counted
// (tapflow_capture_meter_records_lost_total). Each Add's done is called
// once every delta it brought is in an acked batch: the capture then
// records those readings as published (pinned), so what a killed agent
// still held here is published again by the next one.
type MeterFeed struct {
	node string
	log  *slog.Logger
	lost prometheus.Counter

	mu      sync.Mutex
	pending []schemas.Meter
	refs    [][]*doneRef     // per pending record: the Adds it carries
	index   map[meterKey]int // position in pending
	done    bool             // Run has returned: requeues are losses
	kick    chan struct{}
}

type meterKey struct{ ifname, direction string }

// doneRef is one Add's done, called when n reaches 0.
type doneRef struct {
	n int
	f func()
}

// MeterFeedOptions are the collaborators of a MeterFeed.
type MeterFeedOptions struct {
	// Node is written into every record (required).
	Node string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry receives tapflow_capture_meter_records_lost_total; nil
	// registers nothing.
	Registry prometheus.Registerer
}

// NewMeterFeed validates opts and registers the metric; it starts nothing.
func NewMeterFeed(opts MeterFeedOptions) (*MeterFeed, error) {
	if opts.Node == "" {
		return nil, fmt.Errorf("meter feed: node name is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	f := &MeterFeed{
		node: opts.Node, log: log.With("source", "ebpf-meters"),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_capture_meter_records_lost_total",
			Help: "Meter records still unpublished when the agent stopped (their deltas are missing from meter.v1).",
		}),
		index: make(map[meterKey]int),
		kick:  make(chan struct{}, 1),
	}
	if opts.Registry != nil {
		if err := opts.Registry.Register(f.lost); err != nil {
			return nil, fmt.Errorf("meter feed: register metrics: %w", err)
		}
	}
	return f, nil
}

// Name implements pipeline.SourceOf.
func (f *MeterFeed) Name() string { return "ebpf-meters" }

// Add takes meter deltas from the capture (the signature of
// Options.Meters). It copies them, never blocks and never fails; done is
// called once they are all published.
func (f *MeterFeed) Add(_ context.Context, ms []capture.MeterRecord, done func()) error {
	if len(ms) == 0 {
		done()
		return nil
	}
	ref := []*doneRef{{n: len(ms), f: done}}
	f.mu.Lock()
	for i := range ms {
		m := &ms[i]
		f.mergeLocked(schemas.Meter{
			TimeStart: m.TimeStart, TimeEnd: m.TimeEnd, Node: f.node, Ifname: m.Ifname, Direction: m.Direction,
			Packets: m.Packets, Bytes: m.Bytes, LostPackets: m.LostPackets, LostBytes: m.LostBytes,
			FailedUpdates: m.FailedUpdates, SkippedNonIP: m.SkippedNonIP,
		}, ref)
	}
	f.mu.Unlock()
	f.wake()
	return nil
}

// mergeLocked adds m to pending, merged into a waiting record of the same
// tap and direction if there is one.
func (f *MeterFeed) mergeLocked(m schemas.Meter, refs []*doneRef) {
	k := meterKey{m.Ifname, m.Direction}
	i, ok := f.index[k]
	if !ok {
		f.index[k] = len(f.pending)
		f.pending = append(f.pending, m)
		f.refs = append(f.refs, append([]*doneRef(nil), refs...))
		return
	}
	f.refs[i] = append(f.refs[i], refs...)
	p := &f.pending[i]
	p.TimeStart = min(p.TimeStart, m.TimeStart)
	p.TimeEnd = max(p.TimeEnd, m.TimeEnd)
	p.Packets += m.Packets
	p.Bytes += m.Bytes
	p.LostPackets += m.LostPackets
	p.LostBytes += m.LostBytes
	p.FailedUpdates += m.FailedUpdates
	p.SkippedNonIP += m.SkippedNonIP
}

func (f *MeterFeed) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// take empties pending.
func (f *MeterFeed) take() ([]schemas.Meter, [][]*doneRef) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, r := f.pending, f.refs
	f.pending, f.refs = nil, nil
	clear(f.index)
	return p, r
}

// Run forwards waiting deltas as one batch whenever there are some, until
// ctx ends; then it forwards what is left and returns. Cancel ctx only once
// the capture has returned (its last meters are handed over at shutdown).
func (f *MeterFeed) Run(ctx context.Context, out chan<- *pipeline.BatchOf[schemas.Meter]) error {
	defer func() {
		f.mu.Lock()
		f.done = true
		n := len(f.pending)
		f.mu.Unlock()
		if n > 0 { // requeued after the final send: nothing will send them
			recs, _ := f.take()
			f.lose(recs, "still waiting at shutdown")
		}
	}()
	for {
		select {
		case <-ctx.Done():
			if recs, refs := f.take(); len(recs) > 0 {
				out <- pipeline.NewBatchOf(recs, f.ackFor(recs, refs))
			}
			return nil
		case <-f.kick:
			if recs, refs := f.take(); len(recs) > 0 {
				select {
				case out <- pipeline.NewBatchOf(recs, f.ackFor(recs, refs)):
				case <-ctx.Done():
					f.requeue(recs, refs)
				}
			}
		}
	}
}

// ackFor calls the dones of a published batch, and merges a failed one
// back for a retry a second later.
func (f *MeterFeed) ackFor(recs []schemas.Meter, refs [][]*doneRef) pipeline.AckFunc {
	return func(err error) {
		if err == nil {
			var call []func()
			f.mu.Lock()
			for _, rs := range refs {
				for _, r := range rs {
					if r.n--; r.n == 0 {
						call = append(call, r.f)
					}
				}
			}
			f.mu.Unlock()
			for _, c := range call {
				c()
			}
			return
		}
		f.log.Warn("meter batch failed downstream; merged back for a retry", "records", len(recs), "err", err)
		f.requeue(recs, refs)
		time.AfterFunc(time.Second, f.wake)
	}
}

func (f *MeterFeed) requeue(recs []schemas.Meter, refs [][]*doneRef) {
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		f.lose(recs, "failed after shutdown")
		return
	}
	for i, m := range recs {
		// Identity columns are stamped again by the publisher.
		m.AgentID, m.BatchSeq, m.RecordIndex = "", 0, 0
		f.mergeLocked(m, refs[i])
	}
	f.mu.Unlock()
}

func (f *MeterFeed) lose(recs []schemas.Meter, why string) {
	f.lost.Add(float64(len(recs)))
	var packets, bytes int64
	for _, m := range recs {
		packets += m.Packets
		bytes += m.Bytes
	}
	f.log.Error("meter records lost: meter.v1 sums will miss these deltas", "why", why, "records", len(recs),
		"packets", packets, "bytes", bytes)
}
