package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
)

// lockedBuffer is a bytes.Buffer tap writes to while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// tapRun is one `tapflow tap` running in the background.
type tapRun struct {
	out, errb lockedBuffer
	done      chan int
	cancel    context.CancelFunc
}

// startTap runs `tapflow tap --nats-url URL args…` and returns once its
// consumer exists (the "tapping" line), so what is published next is seen.
func startTap(t *testing.T, s *transporttest.Server, args ...string) *tapRun {
	t.Helper()
	return startTapArgs(t, append([]string{"--nats-url", s.ClientURL()}, args...)...)
}

// startTapArgs runs `tapflow tap args…` as startTap does.
func startTapArgs(t *testing.T, args ...string) *tapRun {
	t.Helper()
	r := &tapRun{done: make(chan int, 1)}
	go func() {
		r.done <- run(append([]string{"tap"}, args...), &r.out, &r.errb)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(r.errb.String(), "tapping ") {
		select {
		case code := <-r.done:
			t.Fatalf("tap exited %d before consuming: %s", code, r.errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tap did not start within 30s: %s", r.errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r
}

// wait returns tap's exit code once it exits by itself (--limit).
func (r *tapRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-r.done:
		return code
	case <-time.After(60 * time.Second):
		t.Fatalf("tap did not exit; stdout:\n%s\nstderr:\n%s", r.out.String(), r.errb.String())
		return -1
	}
}

// publishRecs sends recs as one batch through the real agent publisher of
// node (agent "agent-<node>").
func publishRecs(t *testing.T, s *transporttest.Server, node string, recs []schemas.Flow) {
	t.Helper()
	pub, err := publish.New(s.JS, publish.Options{AgentID: "agent-" + node, Node: node, StateDir: t.TempDir(), NATS: transport.DefaultConfig(), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch, 1)
	in <- pipeline.NewBatch(recs, func(err error) {
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	})
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

func TestTapShowsRecordWithinASecond(t *testing.T) {
	s := transporttest.Run(t, "")
	r := startTap(t, s, "--limit", "1")
	rec := schemas.Flow{Node: "cmp1", Ifname: "tap0a1b", Direction: "tx", TenantID: "t-live", Zone: "external", Protocol: 6,
		SrcIP: "10.0.0.5", DstIP: "203.0.113.9", SrcPort: 40001, DstPort: 443, Packets: 3, Bytes: 4321, TimeEnd: time.Now().UnixMicro()}
	start := time.Now()
	publishRecs(t, s, "cmp1", []schemas.Flow{rec})
	for !strings.Contains(r.out.String(), "4321") {
		if time.Since(start) > time.Second {
			t.Fatalf("record not shown %s after its publish; stdout:\n%s", time.Since(start), r.out.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("shown %s after the publish started", time.Since(start))
	if code := r.wait(t); code != exitOK {
		t.Fatalf("exit %d: %s", code, r.errb.String())
	}
	lines := strings.Split(strings.TrimSpace(r.out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "time_end") {
		t.Fatalf("want a header and one line, got:\n%s", r.out.String())
	}
	for _, want := range []string{"cmp1", "tap0a1b", "t-live", "external", "tcp", "10.0.0.5:40001", "203.0.113.9:443", "4321"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("line %q lacks %q", lines[1], want)
		}
	}
}

func TestTapFilters(t *testing.T) {
	// 2 nodes × 2 tenants × 2 zones × 2 ports, 3 records each; Bytes
	// numbers the records so every printed one is identified.
	var byNode = map[string][]schemas.Flow{}
	var all []schemas.Flow
	for _, node := range []string{"cmp1", "cmp2"} {
		for _, tenant := range []string{"t1", "t2"} {
			for _, zone := range []string{"same_tenant", "external"} {
				for _, port := range []int32{443, 22} {
					for range 3 {
						f := schemas.Flow{Node: node, TenantID: tenant, Zone: zone, SrcPort: 50000, DstPort: port, Protocol: 6,
							Bytes: int64(len(all) + 1), Packets: 1, TimeEnd: time.Now().UnixMicro()}
						all = append(all, f)
						byNode[node] = append(byNode[node], f)
					}
				}
			}
		}
	}
	for _, tc := range []struct {
		args []string
		keep func(schemas.Flow) bool
	}{
		{[]string{"--tenant", "t2"}, func(f schemas.Flow) bool { return f.TenantID == "t2" }},
		{[]string{"--zone", "external"}, func(f schemas.Flow) bool { return f.Zone == "external" }},
		{[]string{"--node", "cmp2"}, func(f schemas.Flow) bool { return f.Node == "cmp2" }},
		{[]string{"--port", "22"}, func(f schemas.Flow) bool { return f.DstPort == 22 }},
		{[]string{"--port", "50000", "--tenant", "t1", "--zone", "same_tenant", "--node", "cmp1"}, func(f schemas.Flow) bool {
			return f.TenantID == "t1" && f.Zone == "same_tenant" && f.Node == "cmp1"
		}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			s := transporttest.Run(t, "")
			want := map[int64]bool{}
			for _, f := range all {
				if tc.keep(f) {
					want[f.Bytes] = true
				}
			}
			r := startTap(t, s, append(tc.args, "--format", "json", "--limit", fmt.Sprint(len(want)))...)
			// Records outside the filter go first: printing any of them,
			// or stopping before the last match, fails the test.
			publishRecs(t, s, "cmp1", byNode["cmp1"])
			publishRecs(t, s, "cmp2", byNode["cmp2"])
			if code := r.wait(t); code != exitOK {
				t.Fatalf("exit %d: %s", code, r.errb.String())
			}
			got := map[int64]bool{}
			for _, line := range strings.Split(strings.TrimSpace(r.out.String()), "\n") {
				var f schemas.Flow
				if err := json.Unmarshal([]byte(line), &f); err != nil {
					t.Fatalf("line %q: %v", line, err)
				}
				if !tc.keep(f) || got[f.Bytes] {
					t.Fatalf("printed a record outside the filter, or twice: %s", line)
				}
				got[f.Bytes] = true
			}
			if len(got) != len(want) {
				t.Fatalf("printed %d records, want %d", len(got), len(want))
			}
		})
	}
}

// TestTapLeavesTheCollectorAlone: while tap runs, the collector's durable
// still gets every message, and the stream keeps nothing for tap.
func TestTapLeavesTheCollectorAlone(t *testing.T) {
	s := transporttest.Run(t, "")
	r := startTap(t, s, "--limit", "5")
	recs := make([]schemas.Flow, 5)
	for i := range recs {
		recs[i] = schemas.Flow{Node: "cmp1", TenantID: "t1", Bytes: int64(i + 1), TimeEnd: time.Now().UnixMicro()}
	}
	publishRecs(t, s, "cmp1", recs)
	if code := r.wait(t); code != exitOK {
		t.Fatalf("exit %d: %s", code, r.errb.String())
	}
	ctx := context.Background()
	cons, err := s.JS.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 1 || info.Delivered.Consumer != 0 {
		t.Fatalf("collector durable: %d pending, %d delivered; want the 1 batch pending, none taken", info.NumPending, info.Delivered.Consumer)
	}
	// tap deleted its consumer: nothing but the collector holds messages.
	st, err := s.JS.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(ctx)
	var got []string
	for n := range names.Name() {
		got = append(got, n)
	}
	if names.Err() != nil || len(got) != 1 || got[0] != transport.DefaultDurable {
		t.Fatalf("consumers on %s after tap exited: %v (%v), want only %s", transport.FlowsStream, got, names.Err(), transport.DefaultDurable)
	}
}

func TestTapUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tap", "--help"}, exitOK, "ordered ephemeral consumer"},
		{[]string{"tap", "--format", "xml"}, exitUsage, `--format "xml": use table or json`},
		{[]string{"tap", "--zone", "moon"}, exitUsage, `--zone "moon": unknown`},
		{[]string{"tap", "--port", "70000"}, exitUsage, "--port 70000"},
		{[]string{"tap", "--node", "cmp.*"}, exitUsage, "without NATS wildcards"},
		{[]string{"tap", "--slots", "0"}, exitUsage, "--slots 0: use 1..64"},
		{[]string{"tap"}, exitUsage, "no NATS to connect to"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if code == exitOK {
				stderr = stdout // help goes to stdout
			}
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// TestTapAsOrderedUser: tap on a secured embedded server (mutual TLS,
// nats.server.users as docs/security.md configures them) as an ordered
// subscriber with ordered_slots 2, whose role allows only the consumers
// tap-0 and tap-1: two taps at once take one each and both print the
// record, a third is refused naming the slots and the fix, and at exit
// both consumers are gone (the slots free again).
func TestTapAsOrderedUser(t *testing.T) {
	dir := t.TempDir()
	pki := transporttest.NewPKI(t, dir)
	pw := filepath.Join(dir, "tap.pw") // the server's and the client's
	if err := os.WriteFile(pw, []byte("pw-of-tap\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := transport.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Server = transport.ServerConfig{
		TLS:   transport.ServerTLS{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, CAFile: pki.CA},
		Users: []transport.ServerUser{{User: "tap", PasswordFile: pw, Role: transport.RoleSubscriber, Ordered: true, OrderedSlots: 2}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := transport.NewEmbeddedServer(filepath.Join(dir, "store"), "tap-test", cfg, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	// This process's own in-process client: streams and the agent's publish.
	nc, err := e.Connect("test", quietLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := transport.EnsureStreams(context.Background(), js, transport.DefaultConfig(), quietLog); err != nil {
		t.Fatal(err)
	}
	s := &transporttest.Server{Embedded: e, NC: nc, JS: js, Dir: dir}
	conf := filepath.Join(dir, "tap.yaml")
	yaml := fmt.Sprintf("nats:\n  url: %s\n  user: tap\n  password_file: %s\n  tls: {ca_file: %s, cert_file: %s, key_file: %s}\n",
		e.ClientURL(), pw, pki.CA, pki.ClientCert, pki.ClientKey)
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	taps := []*tapRun{startTapArgs(t, "--config", conf, "--slots", "2", "--limit", "1"), startTapArgs(t, "--config", conf, "--slots", "2", "--limit", "1")}
	slots := map[string]bool{}
	for _, r := range taps {
		for _, n := range []string{"tap-0", "tap-1"} {
			if strings.Contains(r.errb.String(), "consumer "+n+";") {
				slots[n] = true
			}
		}
	}
	if len(slots) != 2 {
		t.Fatalf("two taps in slots %v, want tap-0 and tap-1:\n%s\n%s", slots, taps[0].errb.String(), taps[1].errb.String())
	}
	code, _, stderr := runCLI("tap", "--config", conf, "--slots", "2", "--limit", "1")
	if code != exitRuntime || !strings.Contains(stderr, "every ordered consumer slot is in use: tap-0, tap-1") || !strings.Contains(stderr, "ordered_slots") {
		t.Fatalf("third tap with both slots held: exit %d, stderr %q; want a failure naming the slots and ordered_slots", code, stderr)
	}
	publishRecs(t, s, "cmp1", []schemas.Flow{{Node: "cmp1", TenantID: "t1", Bytes: 9876, TimeEnd: time.Now().UnixMicro()}})
	for i, r := range taps {
		if code := r.wait(t); code != exitOK || !strings.Contains(r.out.String(), "9876") {
			t.Fatalf("tap %d: exit %d, stdout %q, stderr %q", i, code, r.out.String(), r.errb.String())
		}
	}
	st, err := js.Stream(context.Background(), transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(context.Background())
	for n := range names.Name() {
		if strings.HasPrefix(n, "tap-") {
			t.Errorf("consumer %s left after tap exited", n)
		}
	}
}
