package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

var quiet = slog.New(slog.DiscardHandler)

// counter is a transform that sums what passes through it.
type counter struct {
	records, bytes atomic.Int64
}

func (c *counter) Name() string { return "count" }
func (c *counter) Apply(_ context.Context, b *pipeline.Batch) error {
	c.records.Add(int64(len(b.Records)))
	for i := range b.Records {
		c.bytes.Add(b.Records[i].Bytes)
	}
	return nil
}

func testConfig(t *testing.T, dir string) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "node-a", dir
	cfg.Synthetic.Tenants, cfg.Synthetic.VMsPerTenant, cfg.Synthetic.LoadBalancers = 4, 6, 2
	cfg.Synthetic.FlowsPerSecond, cfg.Synthetic.RecordsPerSecond = 500, 20000
	cfg.Synthetic.BatchRecords = 2000
	cfg.Synthetic.BatchMaxAge = units.Duration(200 * time.Millisecond)
	// Deviate from the shipped roll_age 5m / ack_wait (roll_age + 2m):
	// these tests read Parquet while the collector runs and wait for
	// JetStream's redelivery after a crash; at the shipped values each
	// wait would be minutes. ack_wait must exceed roll_age + 10s.
	cfg.Collector.Parquet.RollAge = units.Duration(time.Second)
	cfg.Collector.Consumer.AckWait = units.Duration(12 * time.Second)
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newRT(t *testing.T, js jetstream.JetStream) *runtime {
	rt := &runtime{log: quiet, reg: obs.NewRegistry(), js: js}
	rt.pm = pipeline.NewMetrics(nil)
	return rt
}

// runAgentFor runs the real agent (synthetic → enrich → publish) with a
// counting transform in front of the publisher for d.
func runAgentFor(t *testing.T, cfg config.Config, js jetstream.JetStream, d time.Duration) *counter {
	t.Helper()
	a, err := newAgent(cfg, newRT(t, js))
	if err != nil {
		t.Fatal(err)
	}
	c := &counter{}
	a.runner, err = pipeline.NewRunner(pipeline.Config{Name: "agent"}, a.source, []pipeline.Transform{a.engine, c}, a.sink, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if c.records.Load() == 0 {
		t.Fatal("agent produced nothing")
	}
	return c
}

// runCollector runs the real collector until ctx ends.
func runCollector(t *testing.T, ctx context.Context, cfg config.Config, js jetstream.JetStream, drain bool) error {
	t.Helper()
	r, err := newCollector(cfg, newRT(t, js), drain)
	if err != nil {
		t.Fatal(err)
	}
	return r.Run(ctx)
}

// readParquet returns every committed row under dir/flows.
func readParquet(t *testing.T, dir string) []schemas.Flow {
	t.Helper()
	var all []schemas.Flow
	err := filepath.WalkDir(filepath.Join(dir, "flows"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if d.Name()[0] == '.' { // a file being written: readers skip it
			return nil
		}
		if filepath.Ext(p) != ".parquet" {
			t.Errorf("unexpected file in output: %s", p)
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, _ := f.Stat()
		rows, err := pq.Read[schemas.Flow](f, st.Size())
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		hour := time.UnixMicro(rows[0].TimeEnd).UTC().Format("dt=2006-01-02/hour=15")
		if rel, _ := filepath.Rel(filepath.Join(dir, "flows"), filepath.Dir(p)); rel != hour {
			t.Errorf("%s holds rows of %s", p, hour)
		}
		all = append(all, rows...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

type identity struct {
	agent string
	seq   int64
	idx   int32
}

func checkExact(t *testing.T, rows []schemas.Flow, c *counter) {
	t.Helper()
	seen := make(map[identity]bool, len(rows))
	var bytes int64
	for _, r := range rows {
		id := identity{r.AgentID, r.BatchSeq, r.RecordIndex}
		if seen[id] {
			t.Fatalf("record %+v written twice", id)
		}
		seen[id] = true
		bytes += r.Bytes
		if r.TenantID == "" || r.Zone == "" || r.MetadataVersion == 0 {
			t.Fatalf("record not attributed: %+v", r)
		}
	}
	if int64(len(rows)) != c.records.Load() || bytes != c.bytes.Load() {
		t.Fatalf("parquet holds %d rows / %d bytes; agent sent %d / %d", len(rows), bytes, c.records.Load(), c.bytes.Load())
	}
}

// TestEndToEndExactCounts: synthetic → enrich → Arrow → JetStream →
// Parquet; every record arrives exactly once with its bytes.
func TestEndToEndExactCounts(t *testing.T) {
	dir := t.TempDir()
	s := transporttest.Run(t, "")
	cfg := testConfig(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runCollector(t, ctx, cfg, s.JS, true) }()
	c := runAgentFor(t, cfg, s.JS, 2*time.Second)
	cancel() // graceful: drain the stream, commit, ack
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkExact(t, readParquet(t, dir), c)
	noTempFiles(t, dir)
}

func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".tmp" {
			t.Errorf("temporary file left after shutdown: %s", p)
		}
		return nil
	})
}

// TestCollectorRestartLosesNothing stops the collector mid-run twice: once
// gracefully, once as a crash (its NATS connection cut before it commits).
// Nothing is lost and nothing is written twice.
func TestCollectorRestartLosesNothing(t *testing.T) {
	// Its own server, store and output; most of its time is the wait for
	// redelivery (ack_wait), so it runs alongside the chaos runs.
	t.Parallel()
	dir := t.TempDir()
	s := transporttest.Run(t, "")
	cfg := testConfig(t, dir)
	cfg.Collector.Parquet.RollAge = units.Duration(time.Hour) // nothing commits unless stopped
	cfg.Collector.Consumer.AckWait = units.Duration(time.Hour + 15*time.Second)

	var agentCount *counter
	agentDone := make(chan struct{})
	go func() { defer close(agentDone); agentCount = runAgentFor(t, cfg, s.JS, 3*time.Second) }()

	// 1. graceful stop after 1 s, once it holds messages (a loaded
	// machine may take longer to deliver the first): commits and acks
	// what it holds.
	ctx1, stop1 := context.WithCancel(context.Background())
	defer stop1()
	done1 := make(chan error, 1)
	go func() { done1 <- runCollector(t, ctx1, cfg, s.JS, false) }()
	time.Sleep(time.Second)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if info, err := consumerInfo(s.JS, cfg.Collector.Consumer.Durable); err == nil && info.NumAckPending > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the collector received nothing in 30 s")
		}
	}
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	if len(readParquet(t, dir)) == 0 {
		t.Fatal("graceful stop committed nothing")
	}

	// 2. crash: a collector on its own connection, cut after 1 s without
	// committing; its messages stay unacked.
	crashNC, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	crashJS, _ := jetstream.New(crashNC)
	ctx2, stop2 := context.WithCancel(context.Background())
	crashed := make(chan error, 1)
	go func() { crashed <- runCollector(t, ctx2, cfg, crashJS, false) }()
	time.Sleep(time.Second)
	before := len(readParquet(t, dir))
	crashNC.Close() // the process "dies": no more acks reach the server
	stop2()
	<-crashed
	// Whatever the dying collector committed after the cut was never
	// acked; a real crash would not have written it either.
	removeFilesAfter(t, dir, before)
	<-agentDone

	// 3. a fresh collector: the crashed one's messages come back once
	// their ack wait expires; shorten it by re-creating the consumer.
	cfg.Collector.Consumer.AckWait = units.Duration(12 * time.Second)
	cfg.Collector.Parquet.RollAge = units.Duration(time.Second)
	ctx3, stop3 := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop3()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = runCollector(t, ctx3, cfg, s.JS, false) }()
	// Polled until every record is in; the deadline only bounds a failure
	// (ack_wait is 12 s, a loaded CI machine may need a lot longer).
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && int64(len(readParquet(t, dir))) < agentCount.records.Load() {
		time.Sleep(500 * time.Millisecond)
	}
	stop3()
	wg.Wait()
	checkExact(t, readParquet(t, dir), agentCount)
	noTempFiles(t, dir)
}

// removeFilesAfter deletes committed files beyond the first keep rows'
// worth, in commit order — the output a crash at that instant leaves.
func removeFilesAfter(t *testing.T, dir string, keepRows int) {
	t.Helper()
	type file struct {
		path string
		mod  time.Time
		rows int64
	}
	var files []file
	_ = filepath.WalkDir(filepath.Join(dir, "flows"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			info, _ := d.Info()
			f, _ := pq.OpenFile(mustOpen(t, p), info.Size())
			files = append(files, file{p, info.ModTime(), f.NumRows()})
		}
		return nil
	})
	total := 0
	for _, f := range files {
		total += int(f.rows)
	}
	for i := len(files) - 1; i >= 0 && total > keepRows; i-- {
		// newest first
		newest := 0
		for j := range files {
			if files[j].mod.After(files[newest].mod) {
				newest = j
			}
		}
		total -= int(files[newest].rows)
		_ = os.Remove(files[newest].path)
		files = append(files[:newest], files[newest+1:]...)
	}
}

// consumerInfo is the flows stream's durable consumer's state.
func consumerInfo(js jetstream.JetStream, durable string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, transport.FlowsStream, durable)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

func mustOpen(t *testing.T, p string) *os.File {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
