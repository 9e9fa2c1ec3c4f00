package publish_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

var quiet = slog.New(slog.DiscardHandler)

type agent struct {
	pub   *publish.Publisher
	sp    *spool.Spool
	in    chan *pipeline.Batch
	done  chan error
	acked atomic.Int64
	lost  atomic.Int64
	wg    sync.WaitGroup
}

// startAgent runs a publisher with a spool in stateDir, connected to url
// over TCP (through whatever sits at url).
func startAgent(t testing.TB, url, stateDir string, maxBytes units.ByteSize) *agent {
	t.Helper()
	return startAgentCtx(t, url, stateDir, maxBytes, func(ctx context.Context) context.Context { return ctx })
}

// startAgentCtx is startAgent with the publisher's Run context shaped by runCtx.
func startAgentCtx(t testing.TB, url, stateDir string, maxBytes units.ByteSize, runCtx func(context.Context) context.Context) *agent {
	t.Helper()
	cfg := transport.DefaultConfig()
	cfg.URL = url
	cfg.PublishTimeout = units.Duration(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := transport.Connect(ctx, cfg, "agent", quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	scfg := spool.DefaultConfig()
	scfg.Dir, scfg.MaxBytes, scfg.SegmentBytes = stateDir+"/spool", maxBytes, 256<<10
	sp, err := spool.New(scfg, spool.Options{Logger: quiet, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(js, publish.Options{AgentID: "agent-a", Node: "cmp1", StateDir: stateDir, NATS: cfg, Logger: quiet, Spool: sp})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{pub: pub, sp: sp, in: make(chan *pipeline.Batch, 4), done: make(chan error, 1)}
	go func() { a.done <- pub.Run(runCtx(context.Background()), a.in) }()
	return a
}

// send feeds n batches of size records, one every gap; record Bytes carry
// a running number so the test can find every record later.
func (a *agent) send(n, size int, gap time.Duration, first int64) {
	for i := range n {
		recs := make([]schemas.Flow, size)
		for j := range recs {
			recs[j] = schemas.Flow{Bytes: first + int64(i*size+j), Packets: 1, TenantID: "t1", Direction: "tx", SrcIP: strings.Repeat("x", 64)}
		}
		a.wg.Add(1)
		a.in <- pipeline.NewBatch(recs, func(err error) {
			defer a.wg.Done()
			if err != nil {
				a.lost.Add(int64(size))
			} else {
				a.acked.Add(int64(size))
			}
		})
		time.Sleep(gap)
	}
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	close(a.in)
	select {
	case err := <-a.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("publisher did not stop")
	}
	a.wg.Wait()
}

type streamMsg struct {
	seq     int64 // batch_seq from Nats-Msg-Id
	records []schemas.Flow
}

// readStream returns every message of TAPFLOW_FLOWS in stream order.
func readStream(t *testing.T, s *transporttest.Server) []streamMsg {
	t.Helper()
	ctx := context.Background()
	st, err := s.JS.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dec := schemas.NewDecoder()
	var out []streamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		bs, err := strconv.ParseInt(id[strings.LastIndexByte(id, '-')+1:], 10, 64)
		if err != nil {
			t.Fatalf("msg id %q: %v", id, err)
		}
		recs, err := dec.Decode(nil, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		// Replayed batches carry the same contract headers as direct ones.
		agent := id[:strings.LastIndexByte(id, '-')]
		if m.Header.Get(transport.HeaderSchema) != "flow.v1" || m.Header.Get(transport.HeaderCodec) != transport.DefaultConfig().Codec ||
			m.Header.Get(transport.HeaderRecords) != strconv.Itoa(len(recs)) || m.Header.Get(transport.HeaderAgent) != agent ||
			m.Header.Get(transport.HeaderBatchSeq) != strconv.FormatInt(bs, 10) {
			t.Fatalf("message %s: headers %v", id, m.Header)
		}
		out = append(out, streamMsg{seq: bs, records: recs})
	}
	return out
}

// checkStream asserts batch_seqs strictly increase in stream order (replay
// kept the order, no duplicate) and returns the record numbers seen.
func checkStream(t *testing.T, msgs []streamMsg) map[int64]bool {
	t.Helper()
	seen := map[int64]bool{}
	for i, m := range msgs {
		if i > 0 && m.seq <= msgs[i-1].seq {
			t.Fatalf("stream position %d: batch_seq %d after %d: out of order or duplicate", i, m.seq, msgs[i-1].seq)
		}
		for _, r := range m.records {
			if seen[r.Bytes] {
				t.Fatalf("record %d twice in the stream", r.Bytes)
			}
			seen[r.Bytes] = true
		}
	}
	return seen
}

func TestSpool(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s *transporttest.Server, px *chaos.Proxy, dir string)
	}{
		{"network cut: spool, then replay in order", func(t *testing.T, s *transporttest.Server, px *chaos.Proxy, dir string) {
			a := startAgent(t, "nats://"+px.Addr(), dir, 1<<30)
			go func() {
				time.Sleep(300 * time.Millisecond)
				px.Cut()
				time.Sleep(2 * time.Second)
				px.Restore()
			}()
			a.send(120, 500, 25*time.Millisecond, 0) // ~3 s, the cut in the middle
			a.stop(t)
			m := a.sp.Metrics()
			if testutil.ToFloat64(m.Appended) == 0 {
				t.Fatal("nothing was spooled during the cut")
			}
			if a.lost.Load() != 0 {
				t.Fatalf("%d records lost", a.lost.Load())
			}
			seen := checkStream(t, readStream(t, s))
			if len(seen) != 120*500 {
				t.Fatalf("stream holds %d records, want %d", len(seen), 120*500)
			}
			if testutil.ToFloat64(m.Replayed) != testutil.ToFloat64(m.Appended) {
				t.Fatalf("replayed %v of %v spooled", testutil.ToFloat64(m.Replayed), testutil.ToFloat64(m.Appended))
			}
		}},
		{"agent restarts while cut: spool survives, old batches first", func(t *testing.T, s *transporttest.Server, px *chaos.Proxy, dir string) {
			a := startAgent(t, "nats://"+px.Addr(), dir, 1<<30)
			a.send(10, 200, 0, 0)
			px.Cut()
			a.send(30, 200, 10*time.Millisecond, 10*200)
			a.stop(t) // stops with entries in the spool
			if n, _ := a.sp.Pending(); n == 0 {
				t.Fatal("spool empty although NATS was cut")
			}
			px.Restore()
			b := startAgent(t, "nats://"+px.Addr(), dir, 1<<30)
			b.send(10, 200, 10*time.Millisecond, 40*200)
			b.stop(t)
			if n, _ := b.sp.Pending(); n != 0 {
				t.Fatalf("%d batches still spooled", n)
			}
			seen := checkStream(t, readStream(t, s))
			if len(seen) != 50*200 {
				t.Fatalf("stream holds %d records, want %d", len(seen), 50*200)
			}
		}},
		{"full spool: counted loss, no block", func(t *testing.T, s *transporttest.Server, px *chaos.Proxy, dir string) {
			px.Cut()
			a := startAgentCut(t, px, dir)
			start := time.Now()
			a.send(60, 2000, 0, 0)
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("sending 60 batches into a full spool took %s", d)
			}
			a.stop(t)
			m := a.sp.Metrics()
			lost := testutil.ToFloat64(m.DroppedRecords.WithLabelValues("full"))
			if lost == 0 || int64(lost) != a.lost.Load() {
				t.Fatalf("dropped metric %v, acked with error %d", lost, a.lost.Load())
			}
			if a.acked.Load() == 0 {
				t.Fatal("nothing fit in the spool")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := transporttest.Run(t, "")
			px, err := chaos.NewProxy(strings.TrimPrefix(s.ClientURL(), "nats://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = px.Close() })
			tc.run(t, s, px, t.TempDir())
		})
	}
}

func startAgentB(b *testing.B, url, dir string) *agent { return startAgent(b, url, dir, 1<<30) }

// startAgentCut connects while the proxy still passes traffic, then the
// caller's cut applies: transport.Connect needs one successful dial.
func startAgentCut(t *testing.T, px *chaos.Proxy, dir string) *agent {
	px.Restore()
	a := startAgent(t, "nats://"+px.Addr(), dir, 1<<20)
	px.Cut()
	return a
}

// BenchmarkSpoolReplayToNATS: batches spooled during a cut (append rate),
// then replayed into a real JetStream once the cut ends (replay rate,
// one synchronous publish per batch, in order).
func BenchmarkSpoolReplayToNATS(b *testing.B) {
	b.StopTimer()
	for range b.N {
		s := transporttest.Run(b, "")
		px, err := chaos.NewProxy(strings.TrimPrefix(s.ClientURL(), "nats://"))
		if err != nil {
			b.Fatal(err)
		}
		a := startAgentB(b, "nats://"+px.Addr(), b.TempDir())
		px.Cut()
		b.StartTimer()
		start := time.Now()
		a.send(200, 2000, 0, 0)
		appendDur := time.Since(start)
		_, bytes := a.sp.Pending()
		px.Restore()
		// Time from the first replayed batch (the client reconnects up
		// to 1 s after the cut ends) until the spool is empty.
		for testutil.ToFloat64(a.sp.Metrics().Replayed) == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		start = time.Now()
		for !a.sp.Empty() {
			time.Sleep(100 * time.Microsecond)
		}
		replayDur := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(bytes)/1e6/appendDur.Seconds(), "encode+spool-MB/s")
		b.ReportMetric(float64(bytes)/1e6/replayDur.Seconds(), "replay-MB/s")
		b.ReportMetric(199/replayDur.Seconds(), "replay-batches/s")
		b.ReportMetric(float64(bytes)/200, "B/batch")
		close(a.in)
		<-a.done
		px.Close()
	}
}

// TestHardStopSpoolsWhatIsLeft: batches the pipeline still hands over
// after a hard stop (the sink's context ended at shutdown_timeout) go to
// the spool instead of failing, and the next start publishes them: a slow
// graceful stop loses nothing. Without the spool they would be failed.
func TestHardStopSpoolsWhatIsLeft(t *testing.T) {
	s := transporttest.Run(t, "")
	stateDir := t.TempDir()
	a := startAgentCtx(t, s.ClientURL(), stateDir, 64<<20, func(ctx context.Context) context.Context {
		c, cancel := context.WithCancel(ctx)
		cancel() // the hard stop has already happened when the batches arrive
		return c
	})
	a.send(10, 100, 0, 0)
	a.stop(t)
	if lost := a.lost.Load(); lost != 0 {
		t.Fatalf("%d records failed at the hard stop; want them in the spool", lost)
	}
	if acked := a.acked.Load(); acked != 1000 {
		t.Fatalf("%d of 1000 records acked (spooled) at the hard stop", acked)
	}
	// The replayer (NATS is up) or the next start publishes them.
	b := startAgent(t, s.ClientURL(), stateDir, 64<<20)
	b.stop(t)
	seen := checkStream(t, readStream(t, s))
	for i := range int64(1000) {
		if !seen[i] {
			t.Fatalf("record %d not in the stream after the restart (%d of 1000 seen)", i, len(seen))
		}
	}
}
