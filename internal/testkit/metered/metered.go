// Package metered generates a conserved collector output for the tests of
// tapflow audit and report: packets on a few nodes, taps and directions
// over a time span crossing hour boundaries, counted twice as the kernel
// does — by meter ticks (meter.v1: every interval, the bytes of the packets
// since the previous tick, with some packets lost: counted in bytes and
// lost_bytes, never exported) and by flow records (flow.v1: runs of
// packets cut at up to ActiveTimeout, so records straddle ticks and hours)
// — and writes both through the real Parquet sink (sinks/parquet).
package metered

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// Spec shapes the data; zero fields take the defaults named.
type Spec struct {
	Start         time.Time     // first packet (default 2026-12-01T09:40:00Z)
	Span          time.Duration // packets until Start+Span (default 2h: three hours)
	Nodes         int           // default 2
	Taps          int           // per node (default 2)
	MeterInterval time.Duration // default 10s
	ActiveTimeout time.Duration // default 10s
	LossEvery     int           // one packet in LossEvery is lost (default 97; <0: none)
	MeanGap       time.Duration // mean time between packets of a tap and direction (default 450ms)
	Seed          uint64        // default 1
}

func (s Spec) withDefaults() Spec {
	if s.Start.IsZero() {
		s.Start = time.Date(2026, 12, 1, 9, 40, 0, 0, time.UTC)
	}
	if s.Span == 0 {
		s.Span = 2 * time.Hour
	}
	if s.Nodes == 0 {
		s.Nodes = 2
	}
	if s.Taps == 0 {
		s.Taps = 2
	}
	if s.MeterInterval == 0 {
		s.MeterInterval = 10 * time.Second
	}
	if s.ActiveTimeout == 0 {
		s.ActiveTimeout = 10 * time.Second
	}
	if s.LossEvery == 0 {
		s.LossEvery = 97
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	if s.MeanGap == 0 {
		s.MeanGap = 450 * time.Millisecond
	}
	return s
}

// Data is what Generate made.
type Data struct {
	Flows  []schemas.Flow
	Meters []schemas.Meter
}

// Generate makes the records.
func Generate(spec Spec) Data {
	spec = spec.withDefaults()
	rng := rand.New(rand.NewPCG(spec.Seed, 7))
	var d Data
	start := spec.Start.UnixMicro()
	end := spec.Start.Add(spec.Span).UnixMicro()
	tick := spec.MeterInterval.Microseconds()
	active := spec.ActiveTimeout.Microseconds()
	for n := range spec.Nodes {
		node := fmt.Sprintf("cmp%d", n+1)
		for t := range spec.Taps {
			ifname := fmt.Sprintf("tap%d%02d-aa", n+1, t)
			for _, dir := range []string{"tx", "rx"} {
				tenant := fmt.Sprintf("tenant%d", (n+t)%3)
				var cur *schemas.Flow
				var m schemas.Meter
				m.TimeStart, m.TimeEnd = start, start+tick
				flush := func() {
					if cur != nil {
						d.Flows = append(d.Flows, *cur)
						cur = nil
					}
				}
				pkt := 0
				for at := start + rng.Int64N(2000000); at < end; at += 1 + rng.Int64N(2*spec.MeanGap.Microseconds()) {
					for at >= m.TimeEnd { // the tick before this packet
						m.Node, m.Ifname, m.Direction = node, ifname, dir
						d.Meters = append(d.Meters, m)
						m = schemas.Meter{TimeStart: m.TimeEnd, TimeEnd: m.TimeEnd + tick}
					}
					size := int64(60 + rng.IntN(1400))
					m.Packets++
					m.Bytes += size
					pkt++
					if spec.LossEvery > 0 && pkt%spec.LossEvery == 0 {
						m.LostPackets++
						m.LostBytes += size
						continue
					}
					if cur != nil && (at-cur.TimeStart > active || rng.IntN(40) == 0) {
						flush()
					}
					if cur == nil {
						cur = &schemas.Flow{TimeStart: at, Node: node, Ifname: ifname, Direction: dir, TenantID: tenant,
							Zone: "external", EndReason: "active_timeout", IPVersion: 4, Protocol: 6, SrcIP: "10.0.0.1", DstIP: "192.0.2.1", MetadataVersion: 1}
					}
					cur.TimeEnd = at
					cur.Packets++
					cur.Bytes += size
				}
				flush()
				m.Node, m.Ifname, m.Direction = node, ifname, dir
				d.Meters = append(d.Meters, m)
			}
		}
	}
	return d
}

// Write writes d under output (a directory) as the collector does:
// <output>/flows/… and <output>/meters/…, in batches of 500 records, one
// agent per node. Records in skip (flow indexes) are left out, as a
// pipeline losing them would.
func Write(ctx context.Context, output string, d Data, skip map[int]bool) error {
	var flows []schemas.Flow
	for i, f := range d.Flows {
		if !skip[i] {
			flows = append(flows, f)
		}
	}
	if err := write(ctx, output, parquet.FlowSchema, flows, func(r *schemas.Flow, seq int64, i int) {
		r.AgentID, r.BatchSeq, r.RecordIndex = "agent-"+r.Node, seq, int32(i)
	}); err != nil {
		return err
	}
	return write(ctx, output, parquet.MeterSchema, d.Meters, func(r *schemas.Meter, seq int64, i int) {
		r.AgentID, r.BatchSeq, r.RecordIndex = "agent-"+r.Node, seq, int32(i)
	})
}

func write[T any](ctx context.Context, output string, schema parquet.Schema[T], recs []T, stamp func(*T, int64, int)) error {
	cfg := parquet.DefaultConfig()
	cfg.Output = output
	s, err := parquet.NewFor(cfg, schema, parquet.Options{Node: "collector", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer s.Close()
	in := make(chan *pipeline.BatchOf[T])
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, in) }()
	var mu sync.Mutex
	var ackErr error
	acked := make(chan struct{}, 1<<16)
	n := 0
	for i, seq := 0, int64(1); i < len(recs); i, seq = i+500, seq+1 {
		b := append([]T(nil), recs[i:min(i+500, len(recs))]...)
		for j := range b {
			stamp(&b[j], seq, j)
		}
		batch := pipeline.NewBatchOf(b, func(err error) {
			mu.Lock()
			if err != nil && ackErr == nil {
				ackErr = err
			}
			mu.Unlock()
			acked <- struct{}{}
		})
		batch.Seq = seq
		in <- batch
		n++
	}
	close(in)
	if err := <-done; err != nil {
		return err
	}
	for range n {
		<-acked
	}
	mu.Lock()
	defer mu.Unlock()
	if ackErr != nil {
		return fmt.Errorf("metered: a batch failed: %w", ackErr)
	}
	return nil
}
