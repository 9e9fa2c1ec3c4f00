//go:build linux

package capture

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/units"
)

type discard struct{ n int }

func (d *discard) Flows(_ context.Context, recs []Record, done func()) error {
	d.n += len(recs)
	done()
	return nil
}
func (d *discard) Meters(_ context.Context, ms []MeterRecord, done func()) error { done(); return nil }

// BenchmarkDrain measures what the ring-buffer reader sustains: the kernel
// fills the ring with overflow records (a 1-entry table, no flow cache),
// then drain reads, decodes and hands them over. Reports records/s and
// ns/rec of reader CPU.
func BenchmarkDrain(b *testing.B) {
	prereq.Root(b, "to load eBPF")
	cfg := DefaultConfig()
	cfg.PinDir = ""
	cfg.FlowTableEntries = 1
	cfg.RingBufferSize = units.ByteSize(64 << 20)
	h := &discard{}
	c, err := New(cfg, Options{Handler: h})
	if err != nil {
		b.Fatal(err)
	}
	c.spec.NoCache = true // every packet reaches the full table: one overflow record each
	if c.objs, err = bpf.Load(c.spec); err != nil {
		b.Fatal(err)
	}
	defer c.objs.Close()
	if c.ring, err = bpf.OpenRing(c.objs.Records()); err != nil {
		b.Fatal(err)
	}
	defer c.ring.Close()
	frame := make([]byte, 64)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	frame[14] = 0x45
	frame[23] = 17
	run := func(f []byte, n int) {
		if _, _, err := c.objs.Ingress().Benchmark(f, n, nil); err != nil {
			b.Fatal(err)
		}
	}
	other := append([]byte(nil), frame...)
	other[29] = 1
	run(other, 1) // takes the only table slot
	const perFill = 400000
	var readTime time.Duration
	total := 0
	for total < max(b.N, perFill) {
		run(frame, perFill) // perFill overflow records
		start := time.Now()
		before := h.n
		if err := c.drain(context.Background()); err != nil {
			b.Fatal(err)
		}
		readTime += time.Since(start)
		total += h.n - before
	}
	if m, _ := c.objs.ReadMeter(0, bpf.DirTX); m.LostPackets != 0 {
		b.Fatalf("ring lost %d records", m.LostPackets)
	}
	b.ReportMetric(float64(total)/readTime.Seconds(), "rec/s")
	b.ReportMetric(float64(readTime.Nanoseconds())/float64(total), "ns/rec")
}

// BenchmarkExportLive measures one swap barrier's kernel side: ExportLive's
// sweep of N live flows (both flow-cache generations merged, every flow
// exported through the ring, decoded and handed over). Reports ms per
// export and ns per flow; populating the table is not timed. The baseline
// (sweep=idle) is the routine idle sweep of the same table, which exports
// nothing: what every sweep_interval costs anyway.
func BenchmarkExportLive(b *testing.B) {
	prereq.Root(b, "to load eBPF")
	for _, n := range []int{1000, 10000, 100000} {
		for _, live := range []bool{true, false} {
			name := fmt.Sprintf("flows=%d", n)
			if !live {
				name += "/sweep=idle"
			}
			b.Run(name, func(b *testing.B) { benchExport(b, n, live) })
		}
	}
}

func benchExport(b *testing.B, n int, live bool) {
	{
		{
			cfg := DefaultConfig()
			cfg.PinDir = ""
			cfg.FlowTableEntries = 2 * n
			cfg.RingBufferSize = units.ByteSize(16 << 20)
			h := &discard{}
			c, err := New(cfg, Options{Handler: h})
			if err != nil {
				b.Fatal(err)
			}
			if c.objs, err = bpf.Load(c.spec); err != nil {
				b.Fatal(err)
			}
			defer c.objs.Close()
			if c.ring, err = bpf.OpenRing(c.objs.Records()); err != nil {
				b.Fatal(err)
			}
			defer c.ring.Close()
			frame := make([]byte, 64)
			binary.BigEndian.PutUint16(frame[12:], 0x0800)
			frame[14] = 0x45
			frame[23] = 17
			var took time.Duration
			for b.Loop() {
				for i := range n {
					binary.BigEndian.PutUint16(frame[34:], uint16(i))
					frame[33] = byte(i >> 16)
					if _, _, err := c.objs.Ingress().Benchmark(frame, 1, nil); err != nil {
						b.Fatal(err)
					}
				}
				before := h.n
				start := time.Now()
				idle, reason, want := time.Duration(0), bpf.EndInventoryChange, n
				if !live {
					idle, reason, want = time.Hour, bpf.EndIdleTimeout, 0
				}
				if err := c.sweep(context.Background(), idle, reason); err != nil {
					b.Fatal(err)
				}
				if err := c.drain(context.Background()); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				if got := h.n - before; got != want {
					b.Fatalf("exported %d records of %d live flows, want %d", got, n, want)
				}
				if !live { // empty the table for the next round (not timed)
					if err := c.sweep(context.Background(), 0, bpf.EndShutdown); err != nil {
						b.Fatal(err)
					}
					if err := c.drain(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(took.Microseconds())/1000/float64(b.N), "ms/export")
			b.ReportMetric(float64(took.Nanoseconds())/float64(b.N*n), "ns/flow")
		}
	}
}

// BenchmarkStop: the pinned stop (keep) with N live flows in the table —
// what exporting every flow at every stop adds to a restart: the sweep of
// the tables and both flow-cache generations, every record through the
// ring, decoded and handed over (acked at once). flows=0 is the stop's
// fixed cost. Populating the table is not timed.
func BenchmarkStop(b *testing.B) {
	prereq.Root(b, "to load eBPF")
	for _, n := range []int{0, 65536} {
		b.Run(fmt.Sprintf("flows=%d", n), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.PinDir = ""
			cfg.FlowTableEntries = 2 * max(n, 1024)
			h := &discard{}
			c, err := New(cfg, Options{Handler: h, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			if c.objs, err = bpf.Load(c.spec); err != nil {
				b.Fatal(err)
			}
			defer c.objs.Close()
			if c.ring, err = bpf.OpenRing(c.objs.Records()); err != nil {
				b.Fatal(err)
			}
			defer c.ring.Close()
			frame := make([]byte, 64)
			binary.BigEndian.PutUint16(frame[12:], 0x0800)
			frame[14] = 0x45
			frame[23] = 17
			var took time.Duration
			for b.Loop() {
				for i := range n {
					binary.BigEndian.PutUint16(frame[34:], uint16(i))
					frame[33] = byte(i >> 16)
					if _, _, err := c.objs.Ingress().Benchmark(frame, 1, nil); err != nil {
						b.Fatal(err)
					}
				}
				before := h.n
				start := time.Now()
				if err := c.keep(context.Background()); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				if got := h.n - before; got != n {
					b.Fatalf("the stop exported %d records of %d live flows", got, n)
				}
			}
			b.ReportMetric(float64(took.Microseconds())/1000/float64(b.N), "ms/stop")
		})
	}
}
