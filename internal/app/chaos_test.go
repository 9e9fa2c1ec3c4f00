package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/transport"
)

var (
	chaosBinOnce sync.Once
	chaosBinDir  string
	chaosBinErr  error
)

// chaosBinaries builds cmd/tapflow and the chaosnats server
// (internal/testkit/chaos/cmd/chaosnats) once per test binary and returns their
// paths.
func chaosBinaries(t testing.TB) (tapflow, natsServer string) {
	t.Helper()
	chaosBinOnce.Do(func() {
		root, err := versitygw.RepoRoot()
		if err != nil {
			chaosBinErr = err
			return
		}
		dir, err := os.MkdirTemp("", "tapflow-chaos-bin-")
		if err != nil {
			chaosBinErr = err
			return
		}
		start := time.Now()
		chaosBinErr = chaos.Build(root, dir, "./cmd/tapflow", "./internal/testkit/chaos/cmd/chaosnats")
		chaosBinDir = dir
		t.Logf("built tapflow and chaosnats in %s", time.Since(start).Round(time.Millisecond))
	})
	if chaosBinErr != nil {
		t.Fatal(chaosBinErr)
	}
	return filepath.Join(chaosBinDir, "tapflow"), filepath.Join(chaosBinDir, "chaosnats")
}

// natsProc is tapflow's embedded nats-server run as a child process
// (chaosnats: not under the race detector, which is for tapflow's code)
// on a fixed loopback port and store, so it can be stopped and started
// again.
type natsProc struct {
	*chaos.NATS
	addr string
}

func newNATSProc(t *testing.T, bin, dir string) *natsProc {
	t.Helper()
	n, err := chaos.NewNATS(bin, filepath.Join(dir, "nats"), "127.0.0.1:0", filepath.Join(dir, "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	return &natsProc{NATS: n}
}

func (n *natsProc) start(t *testing.T) {
	t.Helper()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	n.addr = n.Addr()
}

func (n *natsProc) stop() { n.Stop() }

// version is the running server's version, as it reports it.
func (n *natsProc) version(t *testing.T) string {
	nc, err := nats.Connect("nats://"+n.addr, nats.Name("chaos-probe"), nats.MaxReconnects(0))
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	defer nc.Close()
	return nc.ConnectedServerVersion()
}

// consumerIdle reports whether the collector's durable consumer has
// nothing pending and nothing unacked.
func (n *natsProc) consumerIdle(t *testing.T, durable string) (bool, string) {
	nc, err := nats.Connect("nats://"+n.addr, nats.Name("chaos-probe"), nats.MaxReconnects(0))
	if err != nil {
		return false, err.Error()
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, transport.FlowsStream, durable)
	if err != nil {
		return false, err.Error()
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	return info.NumPending == 0 && info.NumAckPending == 0, fmt.Sprintf("pending %d, ack pending %d, redelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
}

// chaosCounter sums what the agent hands to its publisher.
type chaosCounter struct{ records, bytes atomic.Int64 }

func (c *chaosCounter) Name() string { return "count" }
func (c *chaosCounter) Apply(_ context.Context, b *pipeline.Batch) error {
	c.records.Add(int64(len(b.Records)))
	for i := range b.Records {
		c.bytes.Add(b.Records[i].Bytes)
	}
	return nil
}

type chaosRun struct {
	// output configures the collector's output in its YAML config and
	// returns a reader of what it committed.
	outputYAML string
	env        []string
	readOutput func(t *testing.T) []schemas.Flow
	// outputDir, when the output is local: its files' tapflow.batch_seqs
	// are read to follow a lost batch.
	outputDir string
	// outage, when set, is called at the given kill index to break and
	// repair the output store (S3 down then up).
	outage func(t *testing.T, i int)
	// collectors is the number of collector processes sharing the durable
	// consumer and the output (default 1); kills go round-robin.
	collectors int
	// mustLog: one of these must appear in the collector's log (proof
	// the outage bit).
	mustLog []string
	// stockNATS, when set, is a stock nats-server binary (Debian's) run
	// as an operator runs it, with no streams: the collectors and the
	// agent create them as they start. Empty: chaosnats, the linked
	// version with the streams created.
	stockNATS string
}

// runChaos: an in-process agent (synthetic source → attribution →
// publisher with spool) publishes through a cuttable TCP proxy to an
// embedded nats-server; the collector is the real tapflow binary as a
// child process. Over the run the collector is SIGKILLed `kills` times at
// random moments, NATS is restarted twice and the agent is cut from NATS
// for `cut`. Then the agent stops, a last collector drains the stream
// and stops gracefully, and every record the agent produced must be in
// the output exactly once.
func runChaos(t *testing.T, r chaosRun, kills int, cut time.Duration) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	bin, natsBin := chaosBinaries(t)
	dir := t.TempDir()
	keepOnFailure(t, dir)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TAPFLOW_CHAOS_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("chaos seed %d (TAPFLOW_CHAOS_SEED=%d reproduces the schedule)", seed, seed)

	nsrv := newNATSProc(t, natsBin, dir)
	if r.stockNATS != "" {
		n, err := chaos.NewStockNATS(r.stockNATS, filepath.Join(dir, "nats"), filepath.Join(dir, "nats.log"))
		if err != nil {
			t.Fatal(err)
		}
		nsrv = &natsProc{NATS: n}
	}
	nsrv.start(t)
	defer nsrv.Close()
	px, err := chaos.NewProxy(nsrv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()

	// Collectors: the real binary, sharing one durable consumer and one
	// output (distinct writer names).
	ncoll := max(r.collectors, 1)
	colls := make([]*chaos.Process, ncoll)
	for k := range colls {
		cfgPath := filepath.Join(dir, fmt.Sprintf("collector-%d.yaml", k))
		yaml := fmt.Sprintf(`node: chaos-collector-%d
data_dir: %s
nats:
  url: nats://%s
collector:
  roll_age: 1s
  ack_wait: 12s
  nak_delay: 200ms
%s
metrics:
  listen: ""
log:
  format: json
`, k, filepath.Join(dir, fmt.Sprintf("collector-%d", k)), nsrv.addr, r.outputYAML)
		if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := chaos.NewProcess(bin, []string{"collector", "--config", cfgPath}, r.env, filepath.Join(dir, fmt.Sprintf("collector-%d.log", k)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		colls[k] = c
	}
	logs := func() string {
		var v []string
		for _, c := range colls {
			v = append(v, c.LogPath())
		}
		return strings.Join(v, " ")
	}

	// Agent: in-process, counted.
	acfg := config.Default()
	acfg.Node, acfg.DataDir = "chaos-agent", filepath.Join(dir, "agent")
	acfg.NATS.URL = "nats://" + px.Addr()
	acfg.NATS.PublishTimeout = units.Duration(time.Second)
	acfg.Synthetic.Tenants, acfg.Synthetic.VMsPerTenant, acfg.Synthetic.LoadBalancers = 4, 6, 2
	acfg.Synthetic.FlowsPerSecond, acfg.Synthetic.RecordsPerSecond = 500, 4000
	acfg.Synthetic.BatchRecords = 400
	acfg.Synthetic.BatchMaxAge = units.Duration(200 * time.Millisecond)
	acfg.Agent.ShutdownTimeout = units.Duration(60 * time.Second)
	acfg.Resolve()
	if err := acfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nc, err := transport.Connect(ctx, acfg.NATS, "chaos-agent", quiet)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ajs, _ := jetstream.New(nc)
	// The agent logs at debug to a file kept with a failed run: one line
	// per batch JetStream acknowledged, to follow a lost batch.
	agentLogPath := filepath.Join(dir, "agent.log")
	agentLogFile, err := os.OpenFile(agentLogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer agentLogFile.Close()
	alog := slog.New(slog.NewJSONHandler(agentLogFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rt := &runtime{log: alog, reg: obs.NewRegistry(), nc: nc, js: ajs, pm: pipeline.NewMetrics(nil)}
	a, err := newAgent(acfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	count := &chaosCounter{}
	a.runner, err = pipeline.NewRunner(pipeline.Config{Name: "agent", ShutdownTimeout: 60 * time.Second}, a.source, []pipeline.Transform{a.engine, count}, a.sink, nil, alog)
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	if r.stockNATS != "" {
		// As app.go does for an agent: the streams are created (or found)
		// while the agent already runs and spools, racing the collectors.
		go func() {
			if err := transport.EnsureStreamsKeepConsumers(agentCtx, ajs, acfg.NATS, quiet); err != nil && agentCtx.Err() == nil {
				t.Errorf("agent's EnsureStreams: %v", err)
			}
		}()
	}
	agentDone := make(chan error, 1)
	go func() { agentDone <- a.Run(agentCtx) }()

	// The schedule.
	start := time.Now()
	natsRestarts, cutAt := 0, kills/3
	var cutDone chan struct{}
	onCommit, failpoints := 0, 0
	armed := make([]bool, ncoll)
	for i := range kills {
		coll := colls[i%ncoll]
		// Every other kill lands right after a commit (acks sent, maybe not
		// yet delivered: the redelivery must be deduplicated); the others
		// at a random moment (mid-write, mid-commit, mid-upload).
		switch {
		case armed[i%ncoll]:
			// Started with the failpoint: let it kill itself between its
			// first commit and the acks.
			for deadline := time.Now().Add(15 * time.Second); coll.Running() && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
		case i%2 == 1 && coll.WaitLog("committed parquet files", 5*time.Second):
			onCommit++
		default:
			time.Sleep(time.Duration(300+rng.IntN(2200)) * time.Millisecond)
		}
		coll.Kill()
		switch {
		case i == kills/4 || i == 3*kills/4:
			nsrv.stop()
			time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
			nsrv.start(t)
			natsRestarts++
		case i == cutAt && cut > 0:
			px.Cut()
			cutDone = make(chan struct{})
			go func() { defer close(cutDone); time.Sleep(cut); px.Restore() }()
		}
		if r.outage != nil {
			r.outage(t, i)
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		// Every fourth start crashes itself between a commit and its acks.
		var env []string
		armed[i%ncoll] = i%4 == 2 && i < kills-ncoll // the last start of each collector runs clean
		if armed[i%ncoll] {
			env = append(env, parquet.FailpointEnv+"=parquet-after-commit:1")
			failpoints++
		}
		if err := coll.Start(env...); err != nil {
			t.Fatal(err)
		}
	}
	scheduleDone := time.Now()
	if cutDone != nil {
		<-cutDone
	}
	// Let the spool replay, then stop the agent gracefully.
	time.Sleep(2 * time.Second)
	stopAgent()
	if err := <-agentDone; err != nil {
		t.Fatalf("agent: %v", err)
	}
	// The last collector drains the stream; then a graceful stop.
	agentStopped := time.Now()
	deadline := time.Now().Add(90 * time.Second)
	var state string
	for {
		idle, s := nsrv.consumerIdle(t, "tapflow-collector")
		state = s
		if idle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("collectors did not drain the stream in 90s: %s; logs %s", state, logs())
		}
		for _, c := range colls {
			if !c.Running() {
				t.Fatalf("a collector exited on its own; log %s", c.LogPath())
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, c := range colls {
		if !c.Stop(30 * time.Second) {
			t.Errorf("collector did not stop gracefully on SIGTERM; log %s", c.LogPath())
		}
	}
	elapsed := time.Since(start)

	rows := r.readOutput(t)
	t.Logf("chaos phases: schedule %s, cut end + spool replay + agent stop %s, drain + collector stop %s, reading the output %s",
		scheduleDone.Sub(start).Round(time.Millisecond), agentStopped.Sub(scheduleDone).Round(time.Millisecond),
		(elapsed - agentStopped.Sub(start)).Round(time.Millisecond), (time.Since(start) - elapsed).Round(time.Millisecond))
	seen := make(map[recID]struct{}, len(rows))
	var bytes int64
	dups := 0
	for _, row := range rows {
		id := recID{row.AgentID, row.BatchSeq, row.RecordIndex}
		if _, ok := seen[id]; ok {
			dups++
		}
		seen[id] = struct{}{}
		bytes += row.Bytes
	}
	lost := count.records.Load() - int64(len(seen))
	starts, killed := 0, 0
	for _, c := range colls {
		a, b := c.Counts()
		starts, killed = starts+a, killed+b
	}
	dropped := 0.0
	if m, err := rt.reg.Gather(); err == nil {
		for _, mf := range m {
			if mf.GetName() == "tapflow_spool_dropped_records_total" {
				for _, x := range mf.GetMetric() {
					dropped += x.GetCounter().GetValue()
				}
			}
		}
	}
	spooled := gatherCounter(rt.reg, "tapflow_spool_appended_batches_total")
	redeliv := 0
	for _, c := range colls {
		redeliv += collectorDedupes(t, c.LogPath())
	}
	t.Logf("chaos: nats-server %s; %s, %d collector(s), starts %d, SIGKILLs %d (%d right after a commit, %d starts with a crash between commit and ack), NATS restarts %d, cut %s, batches spooled %v; records generated %d, in output %d, duplicates %d, lost %d, bytes %d/%d; spool drops %v; redelivered pieces skipped by the ledger %d; consumer %s",
		nsrv.version(t), elapsed.Round(time.Second), ncoll, starts, killed, onCommit, failpoints, natsRestarts, cut, spooled, count.records.Load(), len(rows), dups, lost, bytes, count.bytes.Load(), dropped, redeliv, state)
	if dups != 0 || lost != 0 || bytes != count.bytes.Load() || int64(len(rows)) != count.records.Load() {
		// Where lost records may have gone: the dead-letter subject.
		poison, rejected, died := 0, 0, 0
		for _, c := range colls {
			poison += countLog(c.LogPath(), "poison message: the collector process died decoding it")
			rejected += countLog(c.LogPath(), "message rejected and moved to the dead-letter subject")
			died += countLog(c.LogPath(), "the previous collector process died while decoding a message")
		}
		reportLostBatches(t, agentLogPath, rows, r.outputDir)
		t.Fatalf("not exactly once: %d rows, %d duplicates, %d lost, bytes %d want %d; collector log lines: %d poison, %d dead-lettered, %d starts after a death while decoding; collector logs %s",
			len(rows), dups, lost, bytes, count.bytes.Load(), poison, rejected, died, logs())
	}
	if len(r.mustLog) > 0 {
		n := 0
		for _, m := range r.mustLog {
			for _, c := range colls {
				n += countLog(c.LogPath(), m)
			}
		}
		if n == 0 {
			t.Fatalf("collector logs %s never say any of %q", logs(), r.mustLog)
		}
		t.Logf("collector log lines about the outage: %d", n)
	}
	fired := 0
	for _, c := range colls {
		fired += countLog(c.LogPath(), "failpoint: killing the process after a commit")
	}
	t.Logf("failpoint crashes between commit and ack: %d (of %d armed starts)", fired, failpoints)
	if failpoints > 0 && fired == 0 {
		// A binary built without the tapflow_failpoints tag ignores the
		// variable: the run would pass without its hardest case.
		t.Fatalf("%d collector starts armed the failpoint and none fired: was the binary built with -tags tapflow_failpoints?", failpoints)
	}
	if fired > 0 && redeliv == 0 {
		t.Fatalf("%d collector runs crashed between commit and ack, yet the ledger skipped no redelivered piece", fired)
	}
	if cut > 0 && spooled == 0 {
		t.Fatalf("the agent spooled nothing while cut from NATS for %s", cut)
	}
	_ = testutil.ToFloat64
}

// reportLostBatches logs, for each batch the agent's log says JetStream
// acknowledged and the output holds fewer of its records than it sent,
// its stream sequence and whether a committed file names that sequence
// (tapflow.batch_seqs): a sequence no file names was never written (or
// skipped as committed); one a file names lost rows inside the sink.
func reportLostBatches(t *testing.T, agentLog string, rows []schemas.Flow, out string) {
	t.Helper()
	l, err := readAgentLog(agentLog)
	if err != nil {
		t.Logf("lost batches: agent log: %v", err)
		return
	}
	have := map[int64]int{}
	for _, r := range rows {
		have[r.BatchSeq]++
	}
	var files map[uint64]struct{}
	if out != "" {
		if files, err = committedStreamSeqs(out); err != nil {
			t.Logf("lost batches: reading tapflow.batch_seqs: %v", err)
		}
	}
	seqs := slices.Sorted(maps.Keys(l.acked))
	short := 0
	for _, seq := range seqs {
		b := l.acked[seq]
		if have[seq] >= b.records {
			continue
		}
		short++
		named := "not read"
		if files != nil {
			_, ok := files[b.streamSeq]
			named = strconv.FormatBool(ok)
		}
		t.Logf("lost batch: batch_seq %d, %d of %d records in the output, acked at %s as stream seq %d; a committed file names that stream seq: %s",
			seq, have[seq], b.records, b.at, b.streamSeq, named)
	}
	var unacked []int64
	for seq := range have {
		if _, ok := l.acked[seq]; !ok {
			unacked = append(unacked, seq)
		}
	}
	t.Logf("lost batches: %d acked batches short in the output (of %d acked); %d batch_seqs in the output with no ack line",
		short, len(l.acked), len(unacked))
}

func gatherCounter(reg prometheus.Gatherer, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// collectorDedupes counts the collector's "already committed" log lines.
func collectorDedupes(t testing.TB, path string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && strings.Contains(fmt.Sprint(line["msg"]), "already committed") {
			if p, ok := line["pieces"].(float64); ok {
				n += int(p)
			}
		}
	}
	return n
}

func countLog(path, substr string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), substr)
}

// readLocalOutput reads every committed flow file under out.
func readLocalOutput(out string) func(t *testing.T) []schemas.Flow {
	return func(t *testing.T) []schemas.Flow {
		t.Helper()
		var all []schemas.Flow
		err := filepath.WalkDir(filepath.Join(out, "flows"), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if strings.HasPrefix(d.Name(), ".") {
				t.Errorf("temporary file left after a graceful stop: %s", p)
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
			all = append(all, rows...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return all
	}
}

// TestChaosCollectorKilled: SIGKILLs of the collector process, two NATS
// restarts and a cut between agent and NATS; nothing lost, nothing twice;
// on every nats-server tapflow supports: the version it links (20 kills,
// a 30 s cut) and Debian 12's package, 2.9.10, the oldest supported,
// with no streams at start (10 kills, a 10 s cut: half the wall time;
// the same paths, the linked run covers the long tail). A missing
// Debian server fails the test as root or with $CI set (deps.sh installs it).
func TestChaosCollectorKilled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		server string
		kills  int
		cut    time.Duration
	}{
		{"linked", 20, 30 * time.Second},
		{"debian-2.9", 10, 10 * time.Second},
	} {
		t.Run(tc.server, func(t *testing.T) {
			t.Parallel()
			if testing.Short() {
				t.Skip("chaos run: not in -short")
			}
			r := chaosRun{}
			if tc.server != "linked" {
				bin, v := chaos.DebianNATS(t)
				if !strings.HasPrefix(v, "2.9.") {
					t.Fatalf("%s is %s, want Debian 12's 2.9.x", bin, v)
				}
				r.stockNATS = bin
			}
			out := t.TempDir()
			keepOnFailure(t, out) // the Parquet output, beside the run's directory
			r.outputYAML, r.readOutput, r.outputDir = "  output: "+out, readLocalOutput(out), out
			runChaos(t, r, tc.kills, tc.cut)
		})
	}
}

// TestChaosTwoCollectors: two collector processes share one durable
// consumer and one output; they are SIGKILLed in turn (with the failpoint
// between commit and ack on some starts) while NATS restarts and the agent
// is cut for 10 s. Redeliveries of one collector's committed batches go to
// the other, which must see them in the shared output.
func TestChaosTwoCollectors(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	keepOnFailure(t, out) // the Parquet output, beside the run's directory
	runChaos(t, chaosRun{
		outputYAML: "  output: " + out,
		readOutput: readLocalOutput(out),
		collectors: 2,
	}, 12, 10*time.Second)
}

var _ = slog.LevelInfo

// TestChaosCollectorKilledS3 is the same run with an s3:// output on a
// real S3 server (versitygw), which is also SIGKILLed mid-run and
// restarted a few kills later: uploads are retried, acks held, nothing
// lost or doubled.
func TestChaosCollectorKilledS3(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "lake")
	outage := func(t *testing.T, i int) {
		switch i {
		case 6:
			srv.Stop()
		case 10:
			srv.Restart(t)
		}
	}
	runChaos(t, chaosRun{
		outputYAML: fmt.Sprintf(`  output: s3://lake/tapflow
  s3:
    endpoint: %s
    region: %s
    path_style: true
    request_timeout: 5s
    max_backoff: 2s`, srv.Endpoint, versitygw.Region),
		env: []string{"AWS_ACCESS_KEY_ID=" + versitygw.AccessKey, "AWS_SECRET_ACCESS_KEY=" + versitygw.SecretKey,
			"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent"},
		readOutput: readS3Output(srv, "lake", "tapflow/flows/"),
		outage:     outage,
		// Upload retries, or ledger listings that failed (the batch was
		// nacked for redelivery): either way the outage was met.
		mustLog: []string{"upload to object store failed", "cannot tell whether a batch is already committed"},
	}, 20, 30*time.Second)
}

func readS3Output(srv *versitygw.Server, bucket, prefix string) func(t *testing.T) []schemas.Flow {
	return func(t *testing.T) []schemas.Flow {
		t.Helper()
		var all []schemas.Flow
		for key := range srv.Objects(t, bucket, prefix) {
			if !strings.HasSuffix(key, ".parquet") || strings.Contains(key, "/.") {
				t.Errorf("unexpected object %s", key)
				continue
			}
			b := srv.Get(t, bucket, key)
			rows, err := pq.Read[schemas.Flow](bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatalf("read s3://%s/%s: %v", bucket, key, err)
			}
			all = append(all, rows...)
		}
		return all
	}
}

// recID is a record's unique identity.
type recID struct {
	agent string
	seq   int64
	idx   int32
}
