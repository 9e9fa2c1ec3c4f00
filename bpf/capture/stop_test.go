//go:build linux

package capture

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
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
