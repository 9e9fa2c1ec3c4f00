package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/dlq"
	"github.com/tapflow/tapflow/transport/publish"
)

var quietLog = slog.New(slog.DiscardHandler)

// runCLI runs tapflow with args and returns exit code, stdout, stderr.
func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// publishFlows sends one batch of n records with time_end te through the
// real agent publisher (agent "cmp1" on node "cmp1": agent.id defaults to the node).
func publishFlows(t *testing.T, s *transporttest.Server, state string, n int, te time.Time) {
	t.Helper()
	pub, err := publish.New(s.JS, publish.Options{AgentID: "cmp1", Node: "cmp1", StateDir: state, NATS: transport.DefaultConfig(), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: "cmp1", TimeEnd: te.UnixMicro(), Bytes: int64(i), Packets: 1}
	}
	in := make(chan *pipeline.Batch, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	in <- pipeline.NewBatch(recs, func(err error) {
		defer wg.Done()
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	})
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// collector consumes TAPFLOW_FLOWS with skew until it got want records and
// rejected wantRejected messages for clock skew, then consumes for another
// second to catch duplicates; it returns the records.
func collector(t *testing.T, s *transporttest.Server, skew time.Duration, want int, wantRejected float64) []schemas.Flow {
	t.Helper()
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(10 * time.Second)
	cfg.MaxClockSkew = units.Duration(skew)
	reg := prometheus.NewRegistry()
	src, err := consume.New(s.JS, cfg, consume.Options{Logger: quietLog, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	rejected := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if mf.GetName() == "tapflow_consume_rejected_messages_total" && l.GetName() == "reason" && l.GetValue() == consume.ReasonTime {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return -1
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *pipeline.Batch, 4)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	var got []schemas.Flow
	deadline := time.After(60 * time.Second)
	var settle <-chan time.Time
	for {
		if settle == nil && len(got) >= want && rejected() >= wantRejected {
			settle = time.After(time.Second)
		}
		select {
		case b := <-out:
			got = append(got, b.Records...)
			b.Ack(nil)
		case <-settle:
			cancel()
			go func() {
				for b := range out {
					b.Ack(nil)
				}
			}()
			<-done
			close(out)
			if r := rejected(); r != wantRejected {
				t.Fatalf("rejected for time: %v, want %v", r, wantRejected)
			}
			return got
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("collector got %d records (want %d), rejected %v (want %v)", len(got), want, rejected(), wantRejected)
		}
	}
}

// TestDLQInspectReplay: an agent with its clock 2h ahead sends a batch;
// the collector (max_clock_skew 1h) dead-letters it with reason time
// while a good batch lands. `tapflow dlq inspect` shows it; a replay within
// the stream's duplicate window is held (JetStream would dedupe it away)
// and keeps the letter; once the window passed and the collector accepts
// 3h of skew, `tapflow dlq replay` re-injects it, deletes it from the DLQ,
// and the collector gets its records exactly once; a second replay has
// nothing left to do.
func TestDLQInspectReplay(t *testing.T) {
	s := transporttest.Run(t, "")
	cfgFile := filepath.Join(t.TempDir(), "tapflow.yaml")
	if err := os.WriteFile(cfgFile, []byte("node: cli\nnats:\n  url: "+s.ClientURL()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	publishFlows(t, s, state, 40, time.Now().Add(2*time.Hour)) // skewed agent clock
	publishFlows(t, s, state, 25, time.Now())
	if got := collector(t, s, time.Hour, 25, 1); len(got) != 25 {
		t.Fatalf("collector got %d good records, want 25", len(got))
	}

	code, out, errOut := runCLI("dlq", "inspect", "--config", cfgFile, "--format", "json")
	if code != exitOK {
		t.Fatalf("inspect: exit %d: %s", code, errOut)
	}
	var l dlq.Letter
	if err := json.Unmarshal([]byte(out), &l); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("inspect json: %v: %q", err, out)
	}
	if l.Reason != consume.ReasonTime || l.Records != 40 || l.MsgID == "" || !strings.HasPrefix(l.MsgID, "cmp1-") ||
		l.OrigSubject != transport.FlowsSubject("cmp1") || !strings.Contains(l.Error, "max_clock_skew") {
		t.Fatalf("dead letter %+v", l)
	}
	code, out, _ = runCLI("dlq", "inspect", "--config", cfgFile, "--reason", "time")
	t.Logf("tapflow dlq inspect --reason time:\n%s", out)
	if code != exitOK || !strings.Contains(out, " time ") || !strings.Contains(out, l.MsgID) || !strings.Contains(out, "40") {
		t.Fatalf("inspect table: exit %d\n%s", code, out)
	}
	if code, out, _ = runCLI("dlq", "inspect", "--config", cfgFile, "--reason", "identity", "--format", "json"); code != exitOK || out != "" {
		t.Fatalf("inspect --reason identity: exit %d %q", code, out)
	}
	if code, out, _ = runCLI("dlq", "replay", "--config", cfgFile, "--subject", "tapflow.flows.v1.other", "--format", "json"); code != exitOK || out != "" {
		t.Fatalf("replay of another subject: exit %d %q", code, out)
	}
	code, out, _ = runCLI("dlq", "replay", "--config", cfgFile, "--dry-run")
	if code != exitOK || !strings.Contains(out, string(dlq.WouldReplay)) {
		t.Fatalf("dry run: exit %d %q", code, out)
	}

	// Within the duplicate window JetStream remembers the rejected
	// original's id: the replay is held, the letter stays.
	code, out, errOut = runCLI("dlq", "replay", "--config", cfgFile, "--reason", "time")
	if code != exitRuntime || !strings.Contains(out, string(dlq.Held)) || !strings.Contains(errOut, "1 held") {
		t.Fatalf("replay within the duplicate window: exit %d\n%s%s", code, out, errOut)
	}
	if n := dlqCount(t, s); n != 1 {
		t.Fatalf("DLQ holds %d letters after a held replay, want 1", n)
	}

	// Shorten the window so the test need not wait 2 minutes, then replay
	// until the server has forgotten the id.
	st, err := s.JS.Stream(context.Background(), transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.Duplicates = time.Second
	if _, err := s.JS.UpdateStream(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	// The server forgets the id when its purge timer runs; that timer may
	// still be set for the old 2-minute window (a CI run under load was
	// held for 60 s), so wait past the original window at most.
	deadline := time.Now().Add(150 * time.Second)
	for {
		code, out, errOut = runCLI("dlq", "replay", "--config", cfgFile, "--reason", "time")
		if code == exitOK {
			break
		}
		if !strings.Contains(out, string(dlq.Held)) || time.Now().After(deadline) {
			t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("tapflow dlq replay --reason time:\n%s%s", out, errOut)
	if !strings.Contains(out, string(dlq.Replayed)) || !strings.Contains(errOut, "1 replayed") {
		t.Fatalf("replay output %q %q", out, errOut)
	}
	if n := dlqCount(t, s); n != 0 {
		t.Fatalf("DLQ holds %d letters after the replay, want 0", n)
	}
	// The fixed collector takes the replayed batch, exactly once.
	got := collector(t, s, 3*time.Hour, 40, 0)
	seen := map[int32]bool{}
	for _, r := range got {
		if seen[r.RecordIndex] || r.TimeEnd < time.Now().Add(time.Hour).UnixMicro() {
			t.Fatalf("duplicate or wrong record %+v", r)
		}
		seen[r.RecordIndex] = true
	}
	if len(got) != 40 {
		t.Fatalf("replayed batch: %d records, want 40", len(got))
	}
	if code, _, errOut = runCLI("dlq", "replay", "--config", cfgFile); code != exitOK || !strings.Contains(errOut, "nothing selected") {
		t.Fatalf("second replay: exit %d %q", code, errOut)
	}
}

func dlqCount(t *testing.T, s *transporttest.Server) int {
	t.Helper()
	n := 0
	if err := dlq.List(context.Background(), s.JS, dlq.Filter{}, func(dlq.Letter) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDLQUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"dlq"}, exitUsage, "inspect|replay"},
		{[]string{"dlq", "purge"}, exitUsage, "inspect|replay"},
		{[]string{"dlq", "inspect", "--reason", "nope"}, exitUsage, `--reason "nope": unknown`},
		{[]string{"dlq", "inspect", "--format", "xml"}, exitUsage, "use table or json"},
		{[]string{"dlq", "inspect", "--seq", "x"}, exitUsage, "not a sequence number"},
		{[]string{"dlq", "inspect", "--dry-run"}, exitUsage, "unknown flag: --dry-run"}, // replay only
		{[]string{"dlq", "inspect"}, exitUsage, "nats.listen is not set"},
	} {
		code, _, errOut := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.err) {
			t.Errorf("%v: exit %d, stderr %q; want %d with %q", tc.args, code, errOut, tc.code, tc.err)
		}
	}
}

// TestDLQPrintable: header values a publisher chose reach the terminal
// escaped, not as control sequences.
func TestDLQPrintable(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"cmp7-flows-9", "cmp7-flows-9"},
		{"tapflow.flows.v1.cmp7", "tapflow.flows.v1.cmp7"},
		{"\x1b]0;owned\x07", `\x1b]0;owned\a`},
		{"a\tb", `a\tb`},
		{"ünïcode", "ünïcode"},
	} {
		if got := printable(c.in); got != c.want {
			t.Errorf("printable(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
