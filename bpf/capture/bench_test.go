//go:build linux

package capture

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/tapflow/tapflow/bpf"
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
	if os.Geteuid() != 0 {
		b.Skip("needs root to load eBPF")
	}
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
