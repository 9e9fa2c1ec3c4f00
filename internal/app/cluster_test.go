package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/transport"
)

var (
	natsServerOnce sync.Once
	natsServerBin  string
	natsServerErr  error
)

// natsServerBinary builds the real nats-server (the version go.mod pins)
// once per test binary.
func natsServerBinary(t testing.TB) string {
	t.Helper()
	natsServerOnce.Do(func() {
		root, err := versitygw.RepoRoot()
		if err != nil {
			natsServerErr = err
			return
		}
		dir, err := os.MkdirTemp("", "tapflow-nats-server-")
		if err != nil {
			natsServerErr = err
			return
		}
		start := time.Now()
		natsServerBin, natsServerErr = chaos.BuildNATSServer(root, dir)
		t.Logf("built nats-server in %s", time.Since(start).Round(time.Millisecond))
	})
	if natsServerErr != nil {
		t.Fatal(natsServerErr)
	}
	return natsServerBin
}

// startCluster runs a three-node JetStream cluster of real nats-server
// processes for the test.
func startCluster(t testing.TB, dir string) *chaos.Cluster {
	t.Helper()
	c, err := chaos.NewCluster(natsServerBinary(t), dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Start(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestChaosClusterR3: the transport on a real three-node nats-server
// cluster with nats.replicas: 3. Two real agent processes (synthetic
// source, spool on) and two real collector processes (one durable, one
// output) run while the TAPFLOW_FLOWS leader is SIGKILLed and restarted,
// then another node (the consumer's leader when it can be), and while
// that node is down a collector is SIGKILLed and restarted. Every record the agents generated must be in Parquet exactly
// once.
func TestChaosClusterR3(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	bin, _ := chaosBinaries(t)
	dir := t.TempDir()
	keepOnFailure(t, dir)
	out := filepath.Join(dir, "out")
	start := time.Now()
	cl := startCluster(t, filepath.Join(dir, "cluster"))
	t.Logf("cluster of 3 healthy in %s: %s", time.Since(start).Round(time.Millisecond), cl.URLs())

	// replicas 3: the test's subject. publish_timeout 2s (shipped 10s): a
	// publish to a killed leader fails over to the spool sooner.
	natsYAML := fmt.Sprintf("nats:\n  url: %s\n  replicas: 3\n  publish_timeout: 2s\n", cl.URLs())
	newProc := func(name, yaml string, args ...string) *chaos.Process {
		t.Helper()
		cfg := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := chaos.NewProcess(bin, append(args, "--config", cfg), nil, filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	colls := make([]*chaos.Process, 2)
	for k := range colls {
		name := fmt.Sprintf("collector-%d", k)
		colls[k] = newProc(name, fmt.Sprintf(`node: chaos-%s
data_dir: %s
%scollector:
  output: %s
  # shipped roll_age 5m, ack_wait roll_age + 2m, nak_delay 5s: a SIGKILLed
  # collector's messages come back after ack_wait, which the test waits for
  roll_age: 1s
  ack_wait: 12s
  nak_delay: 200ms
metrics:
  listen: ""
log:
  format: json
`, name, filepath.Join(dir, name), natsYAML, out), "collector")
	}
	agents := make([]*chaos.Process, 2)
	for k := range agents {
		name := fmt.Sprintf("agent-%d", k)
		agents[k] = newProc(name, fmt.Sprintf(`node: chaos-%s
source: synthetic
data_dir: %s
%sagent:
  # shipped 30s: the final graceful stop replays what the kills spooled
  shutdown_timeout: 90s
synthetic:
  seed: %d
  tenants: 4
  vms_per_tenant: 6
  load_balancers: 2
  flows_per_second: 500
  records_per_second: 3000
  batch_records: 400
  batch_max_age: 200ms
metrics:
  listen: ""
log:
  format: json
  level: debug
`, name, filepath.Join(dir, name), natsYAML, k+1), "agent")
	}
	procs := append(append([]*chaos.Process{}, colls...), agents...)
	logs := func() string {
		var v []string
		for _, p := range procs {
			v = append(v, p.LogPath())
		}
		for _, n := range cl.Nodes {
			v = append(v, n.LogPath())
		}
		return strings.Join(v, " ")
	}
	alive := func(what string) {
		t.Helper()
		for _, p := range procs {
			if !p.Running() {
				t.Fatalf("%s: %s exited on its own (%v); logs %s", what, p.LogPath(), p.ExitErr(), logs())
			}
		}
	}

	// Traffic flows end to end before anything is killed.
	if !colls[0].WaitLog("committed parquet files", 60*time.Second) && !colls[1].WaitLog("committed parquet files", 10*time.Second) {
		t.Fatalf("no collector committed a file within 70s; logs %s", logs())
	}
	info, err := cl.StreamInfo(transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream %s is not R3: config replicas %d, cluster %+v", transport.FlowsStream, info.Config.Replicas, info.Cluster)
	}
	ci, err := cl.ConsumerInfo(transport.FlowsStream, "tapflow-collector")
	if err != nil {
		t.Fatal(err)
	}
	if ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
		t.Fatalf("durable consumer is not R3 (it should inherit the stream's replicas): config replicas %d, cluster %+v", ci.Config.Replicas, ci.Cluster)
	}
	t.Logf("stream %s R%d: leader %s, replicas %d; consumer leader %s, replicas %d",
		transport.FlowsStream, info.Config.Replicas, info.Cluster.Leader, len(info.Cluster.Replicas), ci.Cluster.Leader, len(ci.Cluster.Replicas))

	// killNode SIGKILLs n, waits for the stream to elect another leader
	// and to take traffic for a while, runs whileDown, then restarts n
	// with its store and waits until it is healthy (caught up) again.
	var kills, restarts []string
	var tl timeline
	killNode := func(n *chaos.ClusterNode, why string, whileDown func()) {
		t.Helper()
		t0 := time.Now()
		n.Kill()
		tl.add("SIGKILL nats %s (%s)", n.Name, why)
		kills = append(kills, fmt.Sprintf("nats %s (%s)", n.Name, why))
		leader, err := cl.WaitLeader(transport.FlowsStream, n.Name, 60*time.Second)
		if err != nil {
			t.Fatalf("after SIGKILL of %s: %v; logs %s", n.Name, err, logs())
		}
		elected := time.Since(t0)
		tl.add("stream leader %s", leader.Name)
		// Records keep landing while the node is down.
		committed := colls[0].WaitLog("committed parquet files", 30*time.Second) || colls[1].WaitLog("committed parquet files", 10*time.Second)
		if !committed {
			t.Fatalf("with %s down no collector committed a file in 40s; logs %s", n.Name, logs())
		}
		if whileDown != nil {
			whileDown()
		}
		alive("node " + n.Name + " down")
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		tl.add("restarted nats %s", n.Name)
		if err := n.WaitHealthy(2 * time.Minute); err != nil {
			t.Fatal(err)
		}
		tl.add("nats %s healthy", n.Name)
		t.Logf("SIGKILL %s (%s): new stream leader %s after %s; back and healthy after %s",
			n.Name, why, leader.Name, elected.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	}

	leader := cl.Node(info.Cluster.Leader)
	if leader == nil {
		t.Fatalf("stream leader %q is not a node of the cluster", info.Cluster.Leader)
	}
	// While the old leader is down, agent-1 is restarted (gracefully: a
	// SIGKILLed synthetic source loses what it held in memory, which no
	// count could tell): it must start on a cluster missing a node.
	killNode(leader, "stream leader", func() {
		a := agents[1]
		tl.add("SIGTERM agent-1")
		if !a.Stop(2*time.Minute) || a.ExitErr() != nil {
			t.Fatalf("agent-1 did not stop gracefully with %s down (%v); log %s", leader.Name, a.ExitErr(), a.LogPath())
		}
		tl.add("agent-1 stopped")
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		if !a.WaitLog("synthetic source started", time.Minute) {
			t.Fatalf("agent-1 restarted with %s down did not start its source in 1m; log %s", leader.Name, a.LogPath())
		}
		restarts = append(restarts, "agent-1 (with "+leader.Name+" down)")
	})

	// Another node: the consumer's leader when that is not the node just
	// killed, else the current stream leader.
	var second *chaos.ClusterNode
	if ci, err := cl.ConsumerInfo(transport.FlowsStream, "tapflow-collector"); err == nil && ci.Cluster != nil && ci.Cluster.Leader != leader.Name {
		second = cl.Node(ci.Cluster.Leader)
	}
	why := "consumer leader"
	if second == nil {
		l, err := cl.WaitLeader(transport.FlowsStream, leader.Name, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		second, why = l, "stream leader"
	}
	// While that node is down, a collector is SIGKILLed right after a
	// commit (its acks may not have reached the consumer leader: the
	// redelivery goes to the other collector or to its restart, and the
	// ledger skips it) and restarted: it must start (streams and durable
	// consumer checked on a cluster missing a node) and commit again.
	killNode(second, why, func() {
		colls[0].WaitLog("committed parquet files", 10*time.Second)
		colls[0].Kill()
		tl.add("SIGKILL collector-0")
		kills = append(kills, "collector-0 (with "+second.Name+" down)")
		time.Sleep(500 * time.Millisecond)
		if err := colls[0].Start(); err != nil {
			t.Fatal(err)
		}
		if !colls[0].WaitLog("committed parquet files", 60*time.Second) {
			t.Fatalf("collector-0 restarted with %s down committed nothing in 60s; log %s", second.Name, colls[0].LogPath())
		}
	})
	alive("after the kills")
	scheduleDone := time.Now()

	// Stop the agents gracefully: each publishes (or replays from its
	// spool) everything it generated, then exits 0.
	tl.add("SIGTERM agents")
	var wg sync.WaitGroup
	graceful := make([]bool, len(agents))
	for k, a := range agents {
		wg.Go(func() { graceful[k] = a.Stop(2 * time.Minute) })
	}
	wg.Wait()
	generated := map[string]int64{}
	for k, a := range agents {
		if !graceful[k] || a.ExitErr() != nil {
			t.Fatalf("agent %d did not stop gracefully (%v); log %s", k, a.ExitErr(), a.LogPath())
		}
		n, ok := syntheticRecords(t, a.LogPath())
		if !ok {
			t.Fatalf("agent %d never logged how many records it generated; log %s", k, a.LogPath())
		}
		generated[fmt.Sprintf("chaos-agent-%d", k)] = n
		// A batch failed downstream is lost: the synthetic source does not
		// resend it.
		for _, bad := range []string{"batch lost", "stopping with batches in the spool", "synthetic batches failing downstream"} {
			if c := countLog(a.LogPath(), bad); c > 0 {
				t.Errorf("agent %d logged %q %d times; log %s", k, bad, c, a.LogPath())
			}
		}
	}
	agentsStopped := time.Now()
	tl.add("agents stopped")

	// The collectors drain the durable consumer, then stop gracefully.
	deadline := time.Now().Add(2 * time.Minute)
	var state string
	for {
		ci, err := cl.ConsumerInfo(transport.FlowsStream, "tapflow-collector")
		if err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 {
			state = fmt.Sprintf("idle, last delivered stream seq %d, ack floor %d, redelivered %d, leader %s",
				ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumRedelivered, clusterLeader(ci.Cluster))
			break
		}
		if err != nil {
			state = err.Error()
		} else {
			state = fmt.Sprintf("pending %d, ack pending %d", ci.NumPending, ci.NumAckPending)
		}
		if time.Now().After(deadline) {
			t.Fatalf("collectors did not drain the stream in 2m: %s; logs %s", state, logs())
		}
		for _, c := range colls {
			if !c.Running() {
				t.Fatalf("a collector exited on its own (%v); log %s", c.ExitErr(), c.LogPath())
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	tl.add("consumer %s", state)
	if si, err := cl.StreamInfo(transport.FlowsStream); err == nil {
		state += fmt.Sprintf("; stream %d messages, seq %d-%d, leader %s", si.State.Msgs, si.State.FirstSeq, si.State.LastSeq, clusterLeader(si.Cluster))
	}
	for _, c := range colls {
		if !c.Stop(time.Minute) {
			t.Errorf("collector did not stop gracefully on SIGTERM; log %s", c.LogPath())
		}
	}
	drained := time.Now()

	rows := readLocalOutput(out)(t)
	seen := make(map[recID]struct{}, len(rows))
	perAgent := map[string]int64{}
	dups := 0
	for _, row := range rows {
		id := recID{row.AgentID, row.BatchSeq, row.RecordIndex}
		if _, ok := seen[id]; ok {
			dups++
			continue
		}
		seen[id] = struct{}{}
		perAgent[row.AgentID]++
	}
	var total, lost int64
	for id, n := range generated {
		total += n
		lost += n - perAgent[id]
	}
	for id := range perAgent {
		if _, ok := generated[id]; !ok {
			t.Errorf("rows from an unknown agent %q", id)
		}
	}
	spooling := 0
	for _, a := range agents {
		spooling += countLog(a.LogPath(), "spooling batches to disk")
	}
	redeliv := 0
	for _, c := range colls {
		redeliv += collectorDedupes(t, c.LogPath())
	}
	t.Logf("chaos cluster R3: %s (cluster start + schedule %s, agent stop %s, drain + collector stop %s, reading the output %s); SIGKILLs %d: %s; graceful restarts: %s; records generated %d (%v), in output %d, duplicates %d, lost %d; agent spooling episodes %d; redelivered pieces skipped by the ledger %d; consumer %s",
		time.Since(start).Round(time.Second), scheduleDone.Sub(start).Round(time.Second), agentsStopped.Sub(scheduleDone).Round(time.Second),
		drained.Sub(agentsStopped).Round(time.Second), time.Since(drained).Round(time.Second), len(kills), strings.Join(kills, ", "), strings.Join(restarts, ", "), total, generated, len(rows), dups, lost, spooling, redeliv, state)
	if total == 0 || dups != 0 || lost != 0 || int64(len(rows)) != total {
		agentLogs := map[string]string{}
		for k, a := range agents {
			agentLogs[fmt.Sprintf("chaos-agent-%d", k)] = a.LogPath()
		}
		t.Fatalf("not exactly once: generated %d, %d rows, %d duplicates, %d lost\n%s\nschedule:\n  %s\nlogs %s",
			total, len(rows), dups, lost, lossReport(rows, agentLogs, out), strings.Join(tl, "\n  "), logs())
	}
}

func clusterLeader(c *jetstream.ClusterInfo) string {
	if c == nil {
		return "none"
	}
	return c.Leader
}

// syntheticRecords reads the record count from the agent's "synthetic
// source stopped" log line (written once the source has flushed its last
// batch).
func syntheticRecords(t testing.TB, path string) (int64, bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var n int64
	found := false
	for sc.Scan() {
		var line struct {
			Msg     string `json:"msg"`
			Records int64  `json:"records"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "synthetic source stopped" {
			n += line.Records
			found = true
		}
	}
	return n, found
}
