package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/tmpfs"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
)

// logSink keeps every log line's message and attributes as text.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (h *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSink) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.mu.Lock()
	h.lines = append(h.lines, b.String())
	h.mu.Unlock()
	return nil
}
func (h *logSink) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logSink) WithGroup(string) slog.Handler      { return h }
func (h *logSink) find(s string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.lines {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestDiskFull: the collector's output is a 4 MiB tmpfs filled to the
// last byte. The collector stops acking and says why (ENOSPC, free space);
// once space returns it commits everything, exactly once. Needs root (to
// mount the tmpfs).
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("disk-full run: not in -short")
	}
	out := tmpfs.Mount(t, 4<<20)
	filler, _ := tmpfs.Fill(t, out)

	s := transporttest.Run(t, "")
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "diskfull", t.TempDir()
	cfg.Collector.Parquet.Output = out
	// The test is about failed commits and their retries: commits every
	// 1s (shipped roll_age 5m; ack_wait follows it) and retries after
	// 200ms (shipped nak_delay 5s) so the disk-full episode fits the test.
	cfg.Collector.Parquet.RollAge = units.Duration(time.Second)
	cfg.Collector.Consumer.AckWait = units.Duration(12 * time.Second)
	cfg.Collector.Consumer.NakDelay = units.Duration(200 * time.Millisecond)
	cfg.Metrics.Listen = ""
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &logSink{}
	rt := &runtime{log: slog.New(logs), reg: obs.NewRegistry(), js: s.JS, pm: pipeline.NewMetrics(nil)}
	coll, err := newCollector(cfg, rt, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- coll.Run(ctx) }()
	defer func() { stop(); <-done }()

	// Publish 20 batches of 500 records through the real agent sink.
	pub, err := publish.New(s.JS, publish.Options{AgentID: "cmp1", Node: "cmp1", StateDir: t.TempDir(), NATS: transport.DefaultConfig(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch, 20)
	var want, wantBytes int64
	base := time.Now().UTC()
	for i := range 20 {
		recs := make([]schemas.Flow, 500)
		for j := range recs {
			te := base.Add(time.Duration(i*500+j) * time.Microsecond).UnixMicro()
			recs[j] = schemas.Flow{Node: "cmp1", TimeStart: te - 10, TimeEnd: te, Bytes: int64(1000 + i*500 + j), Packets: 1, TenantID: "t", Zone: "external", Direction: "tx", SrcIP: "10.0.0.1", DstIP: "192.0.2.7"}
			want++
			wantBytes += recs[j].Bytes
		}
		in <- pipeline.NewBatch(recs, func(err error) {
			if err != nil {
				t.Errorf("publish: %v", err)
			}
		})
	}
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}

	// Full: nothing is committed or acked, and the log says why.
	time.Sleep(3 * time.Second)
	if files, _ := filepath.Glob(filepath.Join(out, "flows", "*", "*", "*.parquet")); len(files) != 0 {
		t.Fatalf("files committed on a full disk: %v", files)
	}
	cons, err := s.JS.Consumer(context.Background(), transport.FlowsStream, cfg.Collector.Consumer.Durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 {
		t.Fatalf("messages acked on a full disk: ack floor %d", info.AckFloor.Stream)
	}
	line := logs.find("no space left on device")
	if line == "" || !strings.Contains(line, "free space") || !strings.Contains(line, out) {
		t.Fatalf("no log line naming ENOSPC, the path and the fix; first error: %q", logs.find("ERROR"))
	}
	t.Logf("while full: %s", line)

	// Space returns: everything is committed and acked.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err = cons.Info(context.Background())
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained 30 s after space returned: %+v", info)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rows := readLocalOutput(out)(t)
	seen := map[recID]bool{}
	var bytes int64
	for _, r := range rows {
		id := recID{r.AgentID, r.BatchSeq, r.RecordIndex}
		if seen[id] {
			t.Fatalf("record %+v twice", id)
		}
		seen[id] = true
		bytes += r.Bytes
	}
	if int64(len(rows)) != want || bytes != wantBytes {
		t.Fatalf("output %d rows / %d bytes, want %d / %d", len(rows), bytes, want, wantBytes)
	}
	_ = jetstream.AckExplicitPolicy
}
