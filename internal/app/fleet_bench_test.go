package app

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/roles"
)

// fleetEnv reads a knob of BenchmarkFleetR3 from the environment.
func fleetEnv[T any](b *testing.B, name string, def T, parse func(string) (T, error)) T {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, v, err)
	}
	return x
}

// BenchmarkFleetR3 is a fleet on a real three-node nats-server cluster
// (R3 streams) with three real collector processes sharing the durable
// consumer, writing Parquet to a local directory. Each agent runs in this
// process through RunAgent (synthetic source → attribution → the agent's
// publisher: its batch identities, Nats-Msg-Id and subject) with its own
// NATS user, allowed to publish only its own node's subjects
// (transport/roles, as docs/security.md configures a cluster).
// Midway the stream leader is SIGKILLed (restarted later) and so is a
// collector (restarted at once). At the end the agents stop, the
// collectors drain, and every record generated must be in Parquet exactly
// once; the figures are compared in docs/capacity.md.
//
// One op is the whole run (use -benchtime 1x). Knobs (environment):
// TAPFLOW_FLEET_AGENTS (200), TAPFLOW_FLEET_RATE records/s per agent
// (50: at 100 the 200 agents' synthetic sources, which wake once per
// record, take about a core of the 2-core build box on their own),
// TAPFLOW_FLEET_DURATION (10m), TAPFLOW_FLEET_ROLL_AGE (30s).
func BenchmarkFleetR3(b *testing.B) {
	nAgents := fleetEnv(b, "TAPFLOW_FLEET_AGENTS", 200, strconv.Atoi)
	rate := fleetEnv(b, "TAPFLOW_FLEET_RATE", 50, strconv.Atoi)
	duration := fleetEnv(b, "TAPFLOW_FLEET_DURATION", 10*time.Minute, time.ParseDuration)
	// roll_age 30s (shipped 5m; ack_wait follows it, roll_age + 2m): the
	// killed collector's messages come back within the run, and the
	// shipped 5m × 200 batches/s would exceed the shipped max_ack_pending
	// (20,000); item 6's freshness trade-off names 30s.
	rollAge := fleetEnv(b, "TAPFLOW_FLEET_ROLL_AGE", 30*time.Second, time.ParseDuration)
	if nAgents < 1 || nAgents > 9999 || rate < 1 {
		b.Fatalf("TAPFLOW_FLEET_AGENTS %d (1..9999), TAPFLOW_FLEET_RATE %d (>= 1)", nAgents, rate)
	}
	for range b.N {
		runFleet(b, nAgents, rate, duration, rollAge)
	}
}

type fleetSample struct {
	streamMsgs, streamBytes uint64
	conns                   int
	natsRSS, collRSS        int64 // max of one process, bytes
}

func runFleet(b *testing.B, nAgents, rate int, duration, rollAge time.Duration) {
	bin, _ := chaosBinaries(b)
	dir := b.TempDir()
	keepOnFailure(b, dir)
	out := filepath.Join(dir, "out")
	var tl timeline

	// Users: one per agent (role agent, its node only), one collector
	// user, and an admin the probes connect as (no_auth_user).
	password := func() string {
		p := make([]byte, 12)
		_, _ = rand.Read(p)
		return hex.EncodeToString(p)
	}
	writeSecret := func(name, pw string) string {
		p := filepath.Join(dir, "secrets", name+".pw")
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		return p
	}
	var users strings.Builder
	addUser := func(u roles.User, pw string) {
		p := roles.For(u)
		q := func(v []string) string {
			var s []string
			for _, x := range v {
				s = append(s, strconv.Quote(x))
			}
			return "[" + strings.Join(s, ", ") + "]"
		}
		fmt.Fprintf(&users, "    {user: %q, password: %q, permissions: {publish: {allow: %s}, subscribe: {allow: %s}}}\n",
			u.Name, pw, q(p.Publish), q(p.Subscribe))
	}
	addUser(roles.User{Name: "probe", Role: roles.Admin}, password())
	collPW := password()
	addUser(roles.User{Name: "collector", Role: roles.Collector}, collPW)
	collSecret := writeSecret("collector", collPW)
	nodes := make([]string, nAgents)
	agentSecrets := make([]string, nAgents)
	for i := range nAgents {
		nodes[i] = fmt.Sprintf("hv%04d", i)
		pw := password()
		addUser(roles.User{Name: "agent-" + nodes[i], Role: roles.Agent, Node: nodes[i]}, pw)
		agentSecrets[i] = writeSecret("agent-"+nodes[i], pw)
	}
	auth := "no_auth_user: probe\nauthorization {\n  users = [\n" + users.String() + "  ]\n}\n"

	start := time.Now()
	cl, err := chaos.NewCluster(natsServerBinary(b), filepath.Join(dir, "cluster"), 3, chaos.ExtraConfig(auth))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cl.Close() })
	if err := cl.Start(2 * time.Minute); err != nil {
		b.Fatal(err)
	}
	b.Logf("cluster of 3 healthy in %s: %s", time.Since(start).Round(time.Millisecond), cl.URLs())
	natsYAML := fmt.Sprintf("nats:\n  url: %s\n  replicas: 3\n  user: collector\n  password_file: %s\n", cl.URLs(), collSecret)

	// Collectors first: they create the streams (an agent may only read
	// their info).
	colls := make([]*chaos.Process, 3)
	for k := range colls {
		name := fmt.Sprintf("collector-%d", k)
		cfg := filepath.Join(dir, name+".yaml")
		yaml := fmt.Sprintf(`node: fleet-%s
data_dir: %s
%scollector:
  output: %s
  roll_age: %s
metrics:
  listen: ""
log:
  format: json
`, name, filepath.Join(dir, name), natsYAML, out, rollAge)
		if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
			b.Fatal(err)
		}
		p, err := chaos.NewProcess(bin, []string{"collector", "--config", cfg}, nil, filepath.Join(dir, name+".log"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Close() })
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		colls[k] = p
	}
	for _, st := range []string{transport.FlowsStream, transport.MetersStream, transport.DLQStream} {
		if _, err := waitStream(cl, st, time.Minute); err != nil {
			b.Fatalf("collectors did not create %s: %v; logs %s", st, err, colls[0].LogPath())
		}
	}
	// and their durables (then the streams have their subjects: an agent
	// may not attach them).
	for _, c := range [][2]string{{transport.FlowsStream, transport.DefaultDurable}, {transport.MetersStream, transport.DefaultDurable + transport.MetersDurableSuffix}} {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if _, err := cl.ConsumerInfo(c[0], c[1]); err == nil {
				break
			} else if time.Now().After(deadline) {
				b.Fatalf("collectors did not create %s on %s: %v", c[1], c[0], err)
			}
		}
	}
	time.Sleep(time.Second)

	// Agents, in this process: the real RunAgent with the shipped
	// defaults but for the synthetic load (one hypervisor's worth) and
	// shutdown_timeout 90s (shipped 30s: the stop right after the chaos
	// replays what the node kill spooled). The records per second an agent
	// reaches is its synthetic source's: on a loaded box its rate limiter
	// drops the time a late timer lost (more than 100 ms), so fleet
	// records/s is what was generated, not agents × rate.
	agentCtx, stopAgents := context.WithCancel(context.Background())
	defer stopAgents()
	agentErrs := make([]error, nAgents)
	agentLogs := make([]string, nAgents)
	var agentsWG sync.WaitGroup
	for i := range nAgents {
		cfg := config.Default()
		cfg.Node, cfg.Source, cfg.DataDir = nodes[i], "synthetic", filepath.Join(dir, "agents", nodes[i])
		cfg.Synthetic.Seed = int64(i + 1)
		cfg.Synthetic.Tenants, cfg.Synthetic.VMsPerTenant, cfg.Synthetic.LoadBalancers = 8, 5, 1
		cfg.Synthetic.RecordsPerSecond, cfg.Synthetic.FlowsPerSecond = rate, max(1, rate/5)
		// batch_records 1024 (shipped 16384): batches still close on
		// batch_max_age (1 s, ~rate records), but the synthetic source
		// allocates batch_records records per batch (~5 MB at 16384):
		// 200 agents in one process would allocate 1 GB/s and spend the
		// box's CPU on GC, which no agent on its own hypervisor does.
		cfg.Synthetic.BatchRecords = max(1024, 2*rate)
		cfg.Agent.ShutdownTimeout = units.Duration(90 * time.Second)
		cfg.NATS.URL, cfg.NATS.Replicas = cl.URLs(), 3
		cfg.NATS.User, cfg.NATS.PasswordFile = "agent-"+nodes[i], agentSecrets[i]
		// As docs/security.md configures agents: the agent role may not
		// create or update streams, it waits for the collectors'.
		cfg.NATS.ManageStreams = new(false)
		cfg.Metrics.Listen = ""
		cfg.Resolve()
		if err := cfg.Validate(); err != nil {
			b.Fatal(err)
		}
		agentLogs[i] = filepath.Join(dir, "agents", nodes[i]+".log")
		if err := os.MkdirAll(filepath.Dir(agentLogs[i]), 0o750); err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(agentLogs[i])
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		log := slog.New(slog.NewJSONHandler(f, nil))
		agentsWG.Go(func() { agentErrs[i] = RunAgent(agentCtx, cfg, log) })
	}
	tl.add("%d agents started", nAgents)
	runStart := time.Now()
	selfCPU0 := selfCPU()

	// Sampling: stream backlog, connections and RSS of the servers,
	// collector RSS, every 2 s.
	var (
		smu  sync.Mutex
		peak fleetSample
	)
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	var sampleWG sync.WaitGroup
	sampleWG.Go(func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			s := fleetSample{}
			if si, err := cl.StreamInfo(transport.FlowsStream); err == nil {
				s.streamMsgs, s.streamBytes = si.State.Msgs, si.State.Bytes
			}
			for _, n := range cl.Nodes {
				if v, err := varz(n.HTTPPort); err == nil {
					s.conns += v.Connections
					s.natsRSS = max(s.natsRSS, v.Mem)
				}
			}
			for _, c := range colls {
				s.collRSS = max(s.collRSS, procRSS(c.Pid()))
			}
			smu.Lock()
			peak.streamMsgs, peak.streamBytes = max(peak.streamMsgs, s.streamMsgs), max(peak.streamBytes, s.streamBytes)
			peak.conns, peak.natsRSS, peak.collRSS = max(peak.conns, s.conns), max(peak.natsRSS, s.natsRSS), max(peak.collRSS, s.collRSS)
			smu.Unlock()
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
		}
	})
	stopSample := func() { stopSampling(); sampleWG.Wait() }
	defer stopSample()

	alive := func(what string) {
		for _, c := range colls {
			if !c.Running() {
				b.Fatalf("%s: %s exited on its own (%v)", what, c.LogPath(), c.ExitErr())
			}
		}
	}
	sleepUntil := func(frac float64) {
		time.Sleep(time.Until(runStart.Add(time.Duration(frac * float64(duration)))))
	}
	// The schedule: node kill at 30%, its restart at 45%, collector kill
	// (and restart) at 55%.
	sleepUntil(0.3)
	alive("before the node kill")
	info, err := cl.StreamInfo(transport.FlowsStream)
	if err != nil || info.Cluster == nil || len(info.Cluster.Replicas) != 2 || info.Config.Replicas != 3 {
		b.Fatalf("stream %s is not R3: %+v %v", transport.FlowsStream, info, err)
	}
	victim := cl.Node(info.Cluster.Leader)
	if victim == nil {
		b.Fatalf("stream leader %q is not a node", info.Cluster.Leader)
	}
	victim.Kill()
	tl.add("SIGKILL nats %s (stream leader)", victim.Name)
	leader, err := cl.WaitLeader(transport.FlowsStream, victim.Name, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	tl.add("stream leader %s", leader.Name)
	sleepUntil(0.45)
	if err := victim.Start(); err != nil {
		b.Fatal(err)
	}
	if err := victim.WaitHealthy(3 * time.Minute); err != nil {
		b.Fatal(err)
	}
	tl.add("nats %s back and healthy", victim.Name)
	sleepUntil(0.55)
	alive("before the collector kill")
	colls[0].Kill()
	tl.add("SIGKILL collector-0")
	time.Sleep(2 * time.Second)
	if err := colls[0].Start(); err != nil {
		b.Fatal(err)
	}
	tl.add("collector-0 restarted")
	sleepUntil(1)
	alive("at the end of the run")

	// Stop the agents: each flushes and publishes what it generated.
	tl.add("stopping agents")
	runEnd := time.Now()
	stopAgents()
	agentsWG.Wait()
	agentsStopped := time.Now()
	agentCPU := selfCPU() - selfCPU0
	tl.add("agents stopped")
	generated := map[string]int64{}
	var total int64
	for i := range nAgents {
		if agentErrs[i] != nil {
			b.Fatalf("agent %s: %v; log %s", nodes[i], agentErrs[i], agentLogs[i])
		}
		n, ok := syntheticRecords(b, agentLogs[i])
		if !ok {
			b.Fatalf("agent %s never logged how many records it generated; log %s", nodes[i], agentLogs[i])
		}
		generated[nodes[i]] = n
		total += n
		for _, bad := range []string{"batch lost", "stopping with batches in the spool", "synthetic batches failing downstream", "Permissions Violation", "permission violation"} {
			if c := countLog(agentLogs[i], bad); c > 0 {
				b.Errorf("agent %s logged %q %d times; log %s", nodes[i], bad, c, agentLogs[i])
			}
		}
	}

	// The collectors commit what is pending (within roll_age), then stop.
	deadline := time.Now().Add(2*rollAge + 3*time.Minute)
	var state string
	var lastSeq uint64
	for {
		ci, err := cl.ConsumerInfo(transport.FlowsStream, transport.DefaultDurable)
		if err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 {
			lastSeq = ci.Delivered.Stream
			state = fmt.Sprintf("idle, last delivered stream seq %d, redelivered %d", ci.Delivered.Stream, ci.NumRedelivered)
			break
		}
		if err != nil {
			state = err.Error()
		} else {
			state = fmt.Sprintf("pending %d, ack pending %d", ci.NumPending, ci.NumAckPending)
		}
		if time.Now().After(deadline) {
			b.Fatalf("collectors did not drain in %s: %s", 2*rollAge+3*time.Minute, state)
		}
		alive("draining")
		time.Sleep(250 * time.Millisecond)
	}
	drained := time.Now()
	tl.add("consumer %s", state)
	stopSample()
	var connsEnd int
	for _, n := range cl.Nodes {
		if v, err := varz(n.HTTPPort); err == nil {
			connsEnd += v.Connections
		}
	}
	var collHWM int64
	for _, c := range colls {
		collHWM = max(collHWM, procHWM(c.Pid()))
	}
	var natsHWM int64
	for _, n := range cl.Nodes {
		natsHWM = max(natsHWM, procHWM(n.Pid()))
	}
	for _, c := range colls {
		if !c.Stop(time.Minute) {
			b.Errorf("collector did not stop gracefully on SIGTERM; log %s", c.LogPath())
		}
	}
	var collCPU, natsCPU time.Duration
	for _, c := range colls {
		collCPU += c.CPUTime()
	}
	for _, n := range cl.Nodes {
		natsCPU += n.CPUTime() + procCPU(n.Pid())
	}
	// Records per message: every stream message is one agent's batch (or
	// a piece of one).
	recsPerMsg := float64(total) / float64(max(lastSeq, 1))
	streamBPerRecord := 0.0
	if peak.streamMsgs > 0 {
		streamBPerRecord = float64(peak.streamBytes) / float64(peak.streamMsgs) / recsPerMsg
	}

	// Parquet back: exactly once, and freshness (flow end → the file's
	// commit, its modification time).
	check := readFleetOutput(b, out, nodes)
	var lost int64
	for i, n := range nodes {
		if d := generated[n] - check.perAgent[i]; d != 0 {
			lost += d
			b.Errorf("agent %s: generated %d, in Parquet %d (once)", n, generated[n], check.perAgent[i])
		}
	}
	dedupes := 0
	for _, c := range colls {
		dedupes += collectorDedupes(b, c.LogPath())
	}

	elapsed := runEnd.Sub(runStart).Seconds()
	p50, p99 := check.fresh.quantile(0.5), check.fresh.quantile(0.99)
	b.ReportMetric(float64(total)/elapsed, "fleet-records/s")
	b.ReportMetric(collCPU.Seconds()/(float64(check.rows)/1e6), "collector-cpu-s/Mrows")
	b.ReportMetric(float64(peak.streamMsgs), "max-backlog-msgs")
	b.ReportMetric(float64(peak.streamBytes)/(1<<20), "max-backlog-MiB")
	b.ReportMetric(streamBPerRecord, "stream-B/record")
	b.ReportMetric(float64(agentCPU.Microseconds())/float64(total), "agent-cpu-µs/record")
	b.ReportMetric(float64(natsCPU.Microseconds())/float64(total), "nats-cpu-µs/record")
	b.ReportMetric(p50, "freshness-p50-s")
	b.ReportMetric(p99, "freshness-p99-s")
	b.ReportMetric(float64(peak.conns), "max-nats-conns")
	b.ReportMetric(float64(peak.natsRSS)/(1<<20), "max-nats-rss-MiB")
	b.ReportMetric(float64(peak.collRSS)/(1<<20), "max-collector-rss-MiB")
	b.ReportMetric(float64(lost), "lost")
	b.ReportMetric(float64(check.dups), "dups")
	b.Logf("fleet R3: %d agents × %d records/s for %s, roll_age %s; records generated %d, rows %d (%d files, %.1f B/row Parquet), duplicates %d, lost %d; "+
		"fleet %.0f records/s; collector CPU %.1f s (%.1f s per M rows, %.0f rows/cpu-s); stream backlog max %d msgs / %.1f MiB (%.1f B/record, %.0f records/msg); agents (this process) CPU %.1f s, nats-servers CPU %.1f s; freshness p50 %.1f s, p99 %.1f s, max %.1f s; "+
		"NATS connections max %d, at end %d; nats-server RSS max %.0f MiB (VmHWM of the live servers %.0f MiB); collector RSS max %.0f MiB (VmHWM at end %.0f MiB); "+
		"redelivered pieces skipped by the ledger %d; agent stop %s, drain %s; consumer %s\nschedule:\n  %s",
		nAgents, rate, duration, rollAge, total, check.rows, check.files, float64(check.bytes)/float64(max(check.rows, 1)), check.dups, lost,
		float64(total)/elapsed, collCPU.Seconds(), collCPU.Seconds()/(float64(check.rows)/1e6), float64(check.rows)/collCPU.Seconds(),
		peak.streamMsgs, float64(peak.streamBytes)/(1<<20), streamBPerRecord, recsPerMsg, agentCPU.Seconds(), natsCPU.Seconds(), p50, p99, check.fresh.quantile(1),
		peak.conns, connsEnd, float64(peak.natsRSS)/(1<<20), float64(natsHWM)/(1<<20), float64(peak.collRSS)/(1<<20), float64(collHWM)/(1<<20),
		dedupes, agentsStopped.Sub(runEnd).Round(time.Second), drained.Sub(agentsStopped).Round(time.Second), state, strings.Join(tl, "\n  "))
	if total == 0 || lost != 0 || check.dups != 0 || check.unknown != 0 || check.rows != total+check.dups {
		b.Fatalf("not exactly once: generated %d, rows %d, duplicates %d, lost %d, rows of unknown agents %d", total, check.rows, check.dups, lost, check.unknown)
	}
}

// waitStream waits until stream exists.
func waitStream(cl *chaos.Cluster, stream string, timeout time.Duration) (uint64, error) {
	deadline := time.Now().Add(timeout)
	for {
		si, err := cl.StreamInfo(stream)
		if err == nil {
			return si.State.Msgs, nil
		}
		if time.Now().After(deadline) {
			return 0, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type varzInfo struct {
	Connections int   `json:"connections"`
	Mem         int64 `json:"mem"` // RSS, bytes
}

// varz reads a node's /varz monitoring endpoint.
func varz(port int) (varzInfo, error) {
	var v varzInfo
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/varz", port))
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// procRSS and procHWM read VmRSS and VmHWM (bytes) of pid; 0 if gone.
func procRSS(pid int) int64 { return procStatus(pid, "VmRSS:") }
func procHWM(pid int) int64 { return procStatus(pid, "VmHWM:") }

func procStatus(pid int, key string) int64 {
	if pid <= 0 {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// procCPU is utime + stime of a live pid (/proc/<pid>/stat, clock ticks
// of 10 ms); 0 if gone.
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// selfCPU is this process's user + system time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// freshHist counts flow-end → commit latencies in 100 ms buckets.
type freshHist struct {
	buckets []int64
	n       int64
}

func (h *freshHist) add(d time.Duration) {
	i := max(0, int(d/(100*time.Millisecond)))
	if i >= len(h.buckets) {
		h.buckets = append(h.buckets, make([]int64, i+1-len(h.buckets))...)
	}
	h.buckets[i]++
	h.n++
}

// quantile is the upper edge (seconds) of the bucket holding quantile q.
func (h *freshHist) quantile(q float64) float64 {
	want := int64(q * float64(h.n))
	var c int64
	for i, n := range h.buckets {
		c += n
		if n > 0 && c >= max(want, 1) {
			return float64(i+1) / 10
		}
	}
	return 0
}

type fleetOutput struct {
	rows, dups, unknown int64
	files               int
	bytes               int64
	perAgent            []int64
	fresh               freshHist
}

// readFleetOutput reads every committed flow file under out, file by file
// (a run holds millions of rows: only batch_seq and record_index of each
// are kept, per agent), counting each record identity (recID) once, the
// duplicates, and each row's freshness.
func readFleetOutput(b *testing.B, out string, nodes []string) fleetOutput {
	b.Helper()
	idx := map[string]int{}
	for i, n := range nodes {
		idx[n] = i
	}
	res := fleetOutput{perAgent: make([]int64, len(nodes))}
	type pos struct {
		seq int64
		idx int32
	}
	ids := make([][]pos, len(nodes))
	err := filepath.WalkDir(filepath.Join(out, "flows"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") {
			b.Errorf("temporary file left after a graceful stop: %s", p)
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		rows, err := pq.Read[schemas.Flow](f, st.Size())
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		res.files++
		res.bytes += st.Size()
		committed := st.ModTime()
		for _, r := range rows {
			res.rows++
			a, ok := idx[r.AgentID]
			if !ok {
				res.unknown++
				continue
			}
			ids[a] = append(ids[a], pos{r.BatchSeq, r.RecordIndex})
			res.fresh.add(committed.Sub(time.UnixMicro(r.TimeEnd)))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for a, v := range ids {
		slices.SortFunc(v, func(x, y pos) int { return cmp.Or(cmp.Compare(x.seq, y.seq), cmp.Compare(x.idx, y.idx)) })
		for i, id := range v {
			if i > 0 && id == v[i-1] {
				res.dups++
				continue
			}
			res.perAgent[a]++
		}
	}
	return res
}
