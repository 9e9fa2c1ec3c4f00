package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/transport"
)

// BenchmarkAgentLive (issue 24 item 7) measures the agent as issue 24's
// goals state it: the real `tapflow agent` process, built from
// cmd/tapflow, on the synthetic source (shipped defaults but for
// synthetic.records_per_second) publishing into a nats-server of its own
// (chaosnats: tapflow's embedded server as a separate process, the
// streams created with the shipped settings). No collector runs: the
// agent creates the collector's durable consumers at start, so the
// stream (interest retention, the shipped 10 GiB max_bytes) keeps every
// batch the run publishes: at most ~250 B/record × rate × (warm-up +
// window + 1m), checked before the run (a window too long for the cap is
// refused), and the run fails if the stream refused a publish anyway.
//
// After a warm-up (TAPFLOW_BENCH_WARMUP, default 15s, at least 10s) a
// steady window (TAPFLOW_BENCH_WINDOW, default 60s) is measured:
//   - cpu_ns/record: the agent process's utime+stime (/proc/PID/stat)
//     over the window divided by the records it published in the window
//     (tapflow_stage_sent_records_total{pipeline="agent",stage="publish"}:
//     records acked by JetStream, not messages);
//   - records/s: those records over the window's wall time; the run fails
//     below 90% of the requested rate (the agent did not keep up);
//   - cores: CPU time over wall time;
//   - rss_max_MiB: the largest VmRSS sampled every second in the window;
//   - rss_hwm_MiB: VmHWM at the end (the process's peak, warm-up included;
//     the kernel folds per-thread RSS counts into it lazily, so it can read
//     a little below the largest VmRSS sample);
//   - allocs/record: heap objects the whole process allocated in the
//     window (go_memstats_mallocs_total: also the scrapes, the NATS client,
//     the runtime) per record published;
//   - stream_B/record: stream bytes per record stored (the codec's size).
//
// The figures are the whole process's: the synthetic source's generation
// (into recycled batch arrays, as the eBPF source decodes into them)
// counts in them, as in the before-figures. The log line adds
// VmRSS every 10 s, the Go heap in use and the host's load average: on a
// shared, loaded box the agent pays CPU for contention and the synthetic
// source drops the time late timers lost (records/s below the request).
//
// TAPFLOW_BENCH_CPUPROFILE=DIR turns on the agent's metrics.pprof and
// saves a CPU profile of each window as DIR/agentlive-<rate>-<codec>.pprof
// (the profiling itself costs the agent some CPU) and a heap profile at
// its end as DIR/agentlive-<rate>-<codec>.heap.pprof. One op is one whole
// run: use -benchtime 1x (make bench does).
func BenchmarkAgentLive(b *testing.B) {
	warmup := fleetEnv(b, "TAPFLOW_BENCH_WARMUP", 15*time.Second, time.ParseDuration)
	window := fleetEnv(b, "TAPFLOW_BENCH_WINDOW", 60*time.Second, time.ParseDuration)
	if warmup < 10*time.Second || window < 5*time.Second {
		b.Fatalf("TAPFLOW_BENCH_WARMUP %s (at least 10s), TAPFLOW_BENCH_WINDOW %s (at least 5s)", warmup, window)
	}
	profDir := os.Getenv("TAPFLOW_BENCH_CPUPROFILE")
	for _, bc := range []struct {
		name  string
		rate  int
		codec string
	}{
		{"rate=100k/codec=lz4", 100_000, "lz4"},
		{"rate=200k/codec=lz4", 200_000, "lz4"},
		{"rate=200k/codec=none", 200_000, "none"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				benchAgentLive(b, bc.rate, bc.codec, warmup, window, profDir)
			}
		})
	}
}

// agentLiveMaxRecordBytes bounds a record's stream bytes at any codec
// (none: ~178 B/record, docs/config.md) for the stream-size check.
const agentLiveMaxRecordBytes = 250

func benchAgentLive(b *testing.B, rate int, codec string, warmup, window time.Duration, profDir string) {
	// The stream keeps everything the run publishes (no collector acks):
	// it must fit the shipped 10 GiB cap, or publishes would be refused.
	need := int64(agentLiveMaxRecordBytes) * int64(rate) * int64((warmup + window + time.Minute).Seconds())
	if capBytes := int64(transport.DefaultConfig().StreamMaxBytes); need > capBytes {
		b.Fatalf("the run would publish up to %d MiB, more than the stream's max_bytes %d MiB (no collector drains it): shorten TAPFLOW_BENCH_WINDOW",
			need>>20, capBytes>>20)
	}
	bin, natsBin := chaosBinaries(b)
	store := b.TempDir() // JetStream store and agent data: GiBs, never kept
	logs := agentLiveLogDir(b)

	n, err := chaos.NewNATS(natsBin, filepath.Join(store, "nats"), "127.0.0.1:0", filepath.Join(logs, "nats.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Close() })
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	cfgPath := filepath.Join(logs, "agent.yaml")
	yaml := fmt.Sprintf(`node: bench
source: synthetic
data_dir: %s
nats:
  url: nats://%s
  codec: %s
synthetic:
  records_per_second: %d
metrics:
  listen: %s
  pprof: %t
log:
  format: json
`, filepath.Join(store, "agent"), n.Addr(), codec, rate, metricsAddr, profDir != "")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		b.Fatal(err)
	}
	p, err := chaos.NewProcess(bin, []string{"agent", "--config", cfgPath}, nil, filepath.Join(logs, "agent.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	b.StopTimer()
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	base := "http://" + metricsAddr
	alive := func(what string) {
		b.Helper()
		if !p.Running() {
			b.Fatalf("%s: the agent exited (%v); log %s", what, p.ExitErr(), p.LogPath())
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		alive("starting")
		if code, _ := agentLiveGet(base + "/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			_, body := agentLiveGet(base + "/readyz")
			b.Fatalf("the agent was not ready within 1m (/readyz %q); log %s", body, p.LogPath())
		}
	}
	pid := p.Pid()

	// Warm-up: flows reach steady state, the stream's first blocks are
	// allocated, the heap finds its size.
	for end := time.Now().Add(warmup); time.Now().Before(end); time.Sleep(time.Second) {
		alive("warming up")
	}

	// Profile of the window, taken concurrently (the handler blocks for
	// the window's seconds).
	var profWG sync.WaitGroup
	var profErr error
	if profDir != "" {
		out := filepath.Join(profDir, fmt.Sprintf("agentlive-%d-%s.pprof", rate, codec))
		secs := int(window.Seconds())
		profWG.Go(func() { profErr = agentLiveProfile(base, secs, out) })
	}

	c0, err := agentLiveCounters(base)
	if err != nil {
		b.Fatalf("scrape at the window's start: %v", err)
	}
	load0 := agentLiveLoad()
	cpu0, t0 := procCPU(pid), time.Now()
	rssMax := procRSS(pid)
	rssTrend := []string{fmt.Sprintf("%.0f", float64(rssMax)/(1<<20))} // every 10 s, MiB
	b.StartTimer()
	for i, next := 1, t0.Add(time.Second); next.Before(t0.Add(window)); i, next = i+1, next.Add(time.Second) {
		time.Sleep(time.Until(next))
		alive("in the window")
		rss := procRSS(pid)
		rssMax = max(rssMax, rss)
		if i%10 == 0 {
			rssTrend = append(rssTrend, fmt.Sprintf("%.0f", float64(rss)/(1<<20)))
		}
	}
	time.Sleep(time.Until(t0.Add(window)))
	cpu1, t1 := procCPU(pid), time.Now()
	b.StopTimer()
	c1, err := agentLiveCounters(base)
	if err != nil {
		b.Fatalf("scrape at the window's end: %v", err)
	}
	si, siErr := agentLiveStream(n.Addr())
	load1 := agentLiveLoad()
	rssMax = max(rssMax, procRSS(pid))
	hwm := procHWM(pid)
	alive("at the window's end")
	profWG.Wait()
	if profErr != nil {
		b.Errorf("CPU profile: %v", profErr)
	}
	if profDir != "" {
		out := filepath.Join(profDir, fmt.Sprintf("agentlive-%d-%s.heap.pprof", rate, codec))
		if err := agentLivePprof(base, "heap", 30*time.Second, out); err != nil {
			b.Errorf("heap profile: %v", err)
		}
	}

	if !p.Stop(time.Minute) {
		b.Errorf("the agent did not stop within 1m of SIGTERM; log %s", p.LogPath())
	} else if err := p.ExitErr(); err != nil {
		b.Errorf("the agent's exit: %v; log %s", err, p.LogPath())
	}

	elapsed := t1.Sub(t0).Seconds()
	records := c1.published - c0.published
	generated := c1.generated - c0.generated
	cpu := cpu1 - cpu0
	if records <= 0 {
		b.Fatalf("the agent published nothing in the %s window (generated %.0f); log %s", window, generated, p.LogPath())
	}
	rps := records / elapsed
	b.ReportMetric(float64(cpu.Nanoseconds())/records, "cpu_ns/record")
	b.ReportMetric(rps, "records/s")
	b.ReportMetric(cpu.Seconds()/elapsed, "cores")
	b.ReportMetric(float64(rssMax)/(1<<20), "rss_max_MiB")
	b.ReportMetric(float64(hwm)/(1<<20), "rss_hwm_MiB")
	b.ReportMetric((c1.mallocs-c0.mallocs)/records, "allocs/record")
	streamB := 0.0
	if siErr == nil && c1.published > 0 {
		streamB = float64(si.bytes) / c1.published
		b.ReportMetric(streamB, "stream_B/record")
	}
	b.ReportMetric(0, "ns/op")
	b.Logf("agent live, codec %s, requested %d records/s: published %.0f records in %.1f s (%.0f records/s; generated %.0f/s), CPU %s (%.3f cores, %.0f ns/record), "+
		"RSS max %.1f MiB, VmHWM %.1f MiB (VmRSS every 10 s: %s MiB; Go heap in use at the end %.1f MiB), %.3f allocs/record; stream %d msgs, %.1f MiB (%.1f B/record, %.0f records/msg) %v; "+
		"host load average %s at the window's start, %s at its end (%d CPUs)",
		codec, rate, records, elapsed, rps, generated/elapsed, cpu.Round(time.Millisecond), cpu.Seconds()/elapsed, float64(cpu.Nanoseconds())/records,
		float64(rssMax)/(1<<20), float64(hwm)/(1<<20), strings.Join(rssTrend, " "), c1.heapInuse/(1<<20), (c1.mallocs-c0.mallocs)/records,
		si.msgs, float64(si.bytes)/(1<<20), streamB, c1.published/float64(max(si.msgs, 1)), siErr, load0, load1, goruntime.NumCPU())

	if rps < 0.9*float64(rate) {
		b.Errorf("the agent did not keep up: %.0f records/s published, below 90%% of the requested %d (generated %.0f/s); log %s",
			rps, rate, generated/elapsed, p.LogPath())
	}
	if c1.refused > 0 || c1.spoolDropped > 0 {
		b.Errorf("JetStream refused %.0f publishes (stream full?) and the spool dropped %.0f records: the figures are not of a healthy agent; log %s",
			c1.refused, c1.spoolDropped, p.LogPath())
	}
}

// agentLiveLogDir is a directory for the run's logs and config, removed
// after a passing run and kept (and named) after a failed one.
func agentLiveLogDir(b *testing.B) string {
	dir, err := os.MkdirTemp("", "tapflow-agentlive-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("logs of the failed run kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

func agentLiveGet(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// agentLiveCounts are the agent's counters the benchmark reads.
type agentLiveCounts struct {
	published    float64 // records acked by JetStream
	generated    float64 // records the synthetic source handed on
	refused      float64 // publishes the stream refused
	spoolDropped float64 // records lost at the spool
	mallocs      float64 // heap objects allocated (go_memstats_mallocs_total)
	heapInuse    float64 // go_memstats_heap_inuse_bytes
}

// agentLiveCounters scrapes the agent's /metrics.
func agentLiveCounters(base string) (agentLiveCounts, error) {
	var c agentLiveCounts
	code, body := agentLiveGet(base + "/metrics")
	if code != http.StatusOK {
		return c, fmt.Errorf("GET /metrics: %d %.200s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return c, fmt.Errorf("parse /metrics: %w", err)
	}
	sum := func(name string, labels map[string]string) (float64, bool) {
		mf, ok := mfs[name]
		if !ok {
			return 0, false
		}
		v, found := 0.0, false
	next:
		for _, m := range mf.GetMetric() {
			for k, want := range labels {
				if agentLiveLabel(m, k) != want {
					continue next
				}
			}
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			found = true
		}
		return v, found
	}
	var ok bool
	if c.published, ok = sum("tapflow_stage_sent_records_total", map[string]string{"pipeline": "agent", "stage": "publish"}); !ok {
		return c, fmt.Errorf("no tapflow_stage_sent_records_total{pipeline=\"agent\",stage=\"publish\"} in /metrics")
	}
	if c.generated, ok = sum("tapflow_synthetic_records_total", nil); !ok {
		return c, fmt.Errorf("no tapflow_synthetic_records_total in /metrics")
	}
	if c.mallocs, ok = sum("go_memstats_mallocs_total", nil); !ok {
		return c, fmt.Errorf("no go_memstats_mallocs_total in /metrics")
	}
	c.heapInuse, _ = sum("go_memstats_heap_inuse_bytes", nil)
	c.refused, _ = sum("tapflow_publish_refused_total", nil)
	c.spoolDropped, _ = sum("tapflow_spool_dropped_records_total", nil)
	return c, nil
}

func agentLiveLabel(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// agentLiveLoad is the host's 1-minute load average (/proc/loadavg): the
// benchmark's box is shared, and a loaded one costs the agent CPU
// (contention) and rate (late timers).
func agentLiveLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

// agentLiveProfile saves a CPU profile of secs seconds from the agent's
// /debug/pprof/profile to out.
func agentLiveProfile(base string, secs int, out string) error {
	return agentLivePprof(base, fmt.Sprintf("profile?seconds=%d", secs), time.Duration(secs+30)*time.Second, out)
}

// agentLivePprof saves the agent's /debug/pprof/<what> to out (heap: the
// window's end, to read what the RSS holds).
func agentLivePprof(base, what string, timeout time.Duration, out string) error {
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(base + "/debug/pprof/" + what)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET /debug/pprof/%s: %d %.200s", what, resp.StatusCode, body)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

type agentLiveStreamState struct{ msgs, bytes uint64 }

// agentLiveStream reads TAPFLOW_FLOWS's messages and bytes.
func agentLiveStream(addr string) (agentLiveStreamState, error) {
	nc, err := nats.Connect("nats://"+addr, nats.Name("bench-probe"), nats.MaxReconnects(0))
	if err != nil {
		return agentLiveStreamState{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return agentLiveStreamState{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, transport.FlowsStream)
	if err != nil {
		return agentLiveStreamState{}, err
	}
	si, err := st.Info(ctx)
	if err != nil {
		return agentLiveStreamState{}, err
	}
	return agentLiveStreamState{si.State.Msgs, si.State.Bytes}, nil
}
