package publish_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// line returns the first log line containing s.
func (l *logBuffer) line(s string) string {
	for _, ln := range strings.Split(l.String(), "\n") {
		if strings.Contains(ln, s) {
			return ln
		}
	}
	return ""
}

// tinyStream replaces stream name with a limits/discard-new stream of
// maxBytes, so a few batches fill it and JetStream refuses the rest with
// "maximum bytes exceeded".
func tinyStream(t *testing.T, s *transporttest.Server, name, subjects string, maxBytes int64) {
	t.Helper()
	ctx := context.Background()
	if err := s.JS.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subjects}, Storage: jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardNew, MaxBytes: maxBytes,
	}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestStreamFull: a real JetStream stream of 64 KiB fills up. The
// publisher (flows with a spool, meters without) logs a full backlog with
// the stream's name, its max_bytes and the fix, counts
// tapflow_publish_refused_total{reason="stream_full"}, keeps the batches
// (spooled or in memory) and never says "unreachable".
func TestStreamFull(t *testing.T) {
	const maxBytes = 64 << 10
	for _, tc := range []struct {
		name   string
		stream string
		run    func(t *testing.T, s *transporttest.Server, cfg transport.Config, log *slog.Logger, reg *prometheus.Registry) (stop func())
	}{
		{"flows with spool", transport.FlowsStream, func(t *testing.T, s *transporttest.Server, cfg transport.Config, log *slog.Logger, reg *prometheus.Registry) func() {
			tinyStream(t, s, transport.FlowsStream, transport.FlowsSubjectRoot+".>", maxBytes)
			dir := t.TempDir()
			scfg := spool.DefaultConfig()
			scfg.Dir = dir + "/spool"
			sp, err := spool.New(scfg, spool.Options{Logger: log, Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			pub, err := publish.New(s.JS, publish.Options{AgentID: "agent-f", Node: "cmp1", StateDir: dir, NATS: cfg, Logger: log, Registry: reg, Spool: sp})
			if err != nil {
				t.Fatal(err)
			}
			in := make(chan *pipeline.Batch)
			done := make(chan error, 1)
			go func() { done <- pub.Run(context.Background(), in) }()
			var lost int
			for i := range 30 { // ~8 KiB each: the stream takes about 8
				recs := make([]schemas.Flow, 100)
				for j := range recs {
					recs[j] = schemas.Flow{Bytes: int64(i*100 + j), SrcIP: strings.Repeat("y", 64)}
				}
				in <- pipeline.NewBatch(recs, func(err error) {
					if err != nil {
						lost++
					}
				})
			}
			if testutil.ToFloat64(sp.Metrics().Appended) == 0 {
				t.Error("nothing was spooled although the stream is full")
			}
			return func() {
				close(in)
				if err := <-done; err != nil {
					t.Error(err)
				}
				if lost != 0 {
					t.Errorf("%d batches acked with an error; a full stream must spool them", lost)
				}
			}
		}},
		{"meters in memory", transport.MetersStream, func(t *testing.T, s *transporttest.Server, cfg transport.Config, log *slog.Logger, reg *prometheus.Registry) func() {
			tinyStream(t, s, transport.MetersStream, transport.MetersSubjectRoot+".>", maxBytes)
			pub, err := publish.NewMeters(s.JS, publish.MeterOptions{AgentID: "agent-m", Node: "cmp1", StateDir: t.TempDir(), NATS: cfg, Logger: log, Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			in := make(chan *pipeline.BatchOf[schemas.Meter], 64)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- pub.Run(ctx, in) }()
			for i := range 30 {
				recs := make([]schemas.Meter, 100)
				for j := range recs {
					recs[j] = schemas.Meter{Bytes: int64(i*100 + j), Ifname: strings.Repeat("t", 64)}
				}
				in <- pipeline.NewBatchOf(recs, nil)
			}
			return func() {
				cancel() // the in-memory retry only ends with a hard stop
				close(in)
				if err := <-done; err != nil {
					t.Error(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := transporttest.Run(t, "")
			cfg := transport.DefaultConfig()
			cfg.Codec = "none" // predictable sizes
			cfg.PublishTimeout = units.Duration(300 * time.Millisecond)
			var logs logBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			reg := prometheus.NewRegistry()
			stop := tc.run(t, s, cfg, log, reg)
			refused := func() float64 {
				v, _ := gathered(t, reg, "tapflow_publish_refused_total", map[string]string{"stream": tc.stream, "reason": "stream_full"})
				return v
			}
			waitFor(t, "a stream-full log line", func() bool { return logs.line("stream backlog full") != "" && refused() > 0 })
			stop()
			line := logs.line("stream backlog full")
			for _, want := range []string{"stream=" + tc.stream, "max_bytes=65536", "maximum bytes exceeded", "tapflow_consume_stream_pending_messages", "raise nats."} {
				if !strings.Contains(line, want) {
					t.Errorf("stream-full line lacks %q:\n%s", want, line)
				}
			}
			if l := logs.line("nreachable"); l != "" {
				t.Errorf("a full stream was logged as unreachable:\n%s", l)
			}
			t.Logf("%s; refused %v", line, refused())
		})
	}
}

// gathered returns the value of the counter or gauge name{labels} as reg
// exposes it, and whether it is exposed at all.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}
