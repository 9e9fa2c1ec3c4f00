//go:build linux

package capture

import (
	"context"
	"encoding/binary"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/units"
)

// holder takes flow batches and never acks them (a downstream that is
// stuck at the stop); meters are acked.
type holder struct {
	mu             sync.Mutex
	records, bytes int64
}

func (h *holder) Flows(_ context.Context, recs []Record, _ func()) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range recs {
		h.records++
		h.bytes += int64(r.Val.Bytes)
	}
	return nil
}

func (h *holder) Meters(_ context.Context, _ []MeterRecord, done func()) error { done(); return nil }

// TestStopStrands: a stop that must let go of records handed over but not
// acked, with no pin to hand them over again, counts every one of them and
// their bytes in tapflow_capture_stranded_*, which exist at 0 from start.
func TestStopStrands(t *testing.T) {
	lab := nslab.New(t)
	a, b := lab.AddVM(1, true), lab.AddVM(2, true)
	cfg := labConfig(lab, attach.Auto) // no pin: nothing will adopt the ring
	h := &holder{}
	reg := prometheus.NewRegistry()
	c, err := New(cfg, Options{Handler: h, Registry: reg, Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"tapflow_capture_stranded_records_total", "tapflow_capture_stranded_bytes_total"} {
		if v := gauge(t, reg, n); v != 0 {
			t.Fatalf("%s = %v before Run", n, v)
		}
	}
	c.ackWait = 500 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	waitFor(t, "2 attached taps", func() bool { return gauge(t, reg, "tapflow_capture_attached_interfaces") == 2 })
	listenUDP(t, b, 9700)
	sendUDP(t, a, b.IP, 9700, 50, 300)
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	h.mu.Lock()
	recs, byts := h.records, h.bytes
	h.mu.Unlock()
	if recs == 0 {
		t.Fatal("nothing was handed over")
	}
	gr, gb := gauge(t, reg, "tapflow_capture_stranded_records_total"), gauge(t, reg, "tapflow_capture_stranded_bytes_total")
	t.Logf("handed over and never acked: %d records, %d bytes; stranded: %v records, %v bytes", recs, byts, gr, gb)
	if gr != float64(recs) || gb != float64(byts) {
		t.Errorf("stranded %v records / %v bytes, want %d / %d (every record handed over and not acked)", gr, gb, recs, byts)
	}
}

// lateAcker acks flow batches from another goroutine a little later, as
// the publisher does once JetStream stores them: the ring's space comes
// back only then, so a stop whose export is larger than the ring must
// wait for acks between sweeps.
type lateAcker struct {
	mu    sync.Mutex
	flows map[bpf.FlowKey]int
	acks  chan func()
}

func (h *lateAcker) Flows(_ context.Context, recs []Record, done func()) error {
	h.mu.Lock()
	for i := range recs {
		h.flows[recs[i].Key]++
	}
	h.mu.Unlock()
	h.acks <- done
	return nil
}

func (h *lateAcker) Meters(_ context.Context, _ []MeterRecord, done func()) error { done(); return nil }

// TestStopExportsTenTimesTheRing: a stop (both kinds: the pinned stop that
// leaves the programs attached, and the detaching one) with live flows
// whose records fill the ring buffer more than ten times over exports
// every flow exactly once; nothing stays in the table, nothing is counted
// stranded.
func TestStopExportsTenTimesTheRing(t *testing.T) {
	prereq.Root(t, "to load eBPF")
	const ring = 16 << 10
	n := 11 * ring / bpf.FlowRecordSize
	for _, tc := range []struct {
		name string
		stop func(*Capture, context.Context) error
	}{
		{"pinned-stop", (*Capture).keep},
		{"detaching-stop", (*Capture).shutdown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.PinDir = "" // the objects are loaded by hand, not by Run
			cfg.FlowTableEntries = 2 * n
			cfg.RingBufferSize = units.ByteSize(ring)
			h := &lateAcker{flows: map[bpf.FlowKey]int{}, acks: make(chan func(), 1024)}
			go func() {
				for done := range h.acks {
					time.Sleep(100 * time.Microsecond)
					done()
				}
			}()
			t.Cleanup(func() { close(h.acks) })
			reg := prometheus.NewRegistry()
			c, err := New(cfg, Options{Handler: h, Registry: reg, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if c.objs, err = bpf.Load(c.spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.objs.Close() })
			if c.ring, err = bpf.OpenRing(c.objs.Records()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.ring.Close() })
			if got := c.objs.Spec().RingBytes; got != ring {
				t.Fatalf("ring %d bytes, want %d", got, ring)
			}
			frame := make([]byte, 64)
			binary.BigEndian.PutUint16(frame[12:], 0x0800)
			frame[14] = 0x45
			frame[23] = 17
			for i := range n {
				binary.BigEndian.PutUint16(frame[34:], uint16(i))
				frame[33] = byte(i >> 16)
				if _, _, err := c.objs.Ingress().Benchmark(frame, 1, nil); err != nil {
					t.Fatal(err)
				}
			}
			// Held counts table and per-CPU cache entries: a flow can be in
			// both until a sweep merges them.
			if held, _, err := c.objs.Held(); err != nil || held < n {
				t.Fatalf("the kernel holds %d entries (%v), want at least the %d flows", held, err, n)
			}
			if err := tc.stop(c, context.Background()); err != nil {
				t.Fatalf("stop: %v", err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			twice := 0
			for _, k := range h.flows {
				if k > 1 {
					twice++
				}
			}
			t.Logf("%d flows, %d bytes of records through a %d-byte ring (%.1f×)", len(h.flows), len(h.flows)*bpf.FlowRecordSize, ring,
				float64(len(h.flows)*bpf.FlowRecordSize)/ring)
			if len(h.flows) != n || twice > 0 {
				t.Errorf("the stop exported %d distinct flows of %d, %d of them more than once", len(h.flows), n, twice)
			}
			if held, _, err := c.objs.Held(); err != nil || held != 0 {
				t.Errorf("after the stop the kernel still holds %d flows (%v)", held, err)
			}
			if v := gauge(t, reg, "tapflow_capture_stranded_records_total"); v != 0 {
				t.Errorf("stranded %v records", v)
			}
		})
	}
}
