package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// TestDLQInspectEvictions: node cmp1 gets 5 garbage messages dead-lettered
// with collector.dlq_letters_per_node 2 (the setting under test), node
// cmp2 one; `tapflow dlq inspect` lists cmp1's 2 newest letters and
// cmp2's, and ends with cmp1's evictions (3 letters, their bytes, reason
// decode, the last evicted msg id) in the table and as {"evicted": …} in
// JSON; a selection of cmp2 or of reason time shows no evictions.
func TestDLQInspectEvictions(t *testing.T) {
	s := transporttest.Run(t, "")
	cfgFile := filepath.Join(t.TempDir(), "tapflow.yaml")
	if err := os.WriteFile(cfgFile, []byte("node: cli\nnats:\n  url: "+s.ClientURL()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	garbage := func(node string, i int) {
		m := &nats.Msg{Subject: transport.FlowsSubject(node), Data: []byte("garbage " + strconv.Itoa(i))}
		if _, err := s.JS.PublishMsg(ctx, m, jetstream.WithMsgID(node+"-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 5; i++ {
		garbage("cmp1", i)
	}
	garbage("cmp2", 1)

	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(10 * time.Second)
	cfg.DLQLettersPerNode = 2
	reg := prometheus.NewRegistry()
	src, err := consume.New(s.JS, cfg, consume.Options{Logger: quietLog, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan *pipeline.Batch)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	evictions := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "tapflow_consume_dlq_evictions_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("tapflow_consume_dlq_evictions_total not registered")
		return 0
	}
	for evictions() < 3 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	// cmp2's letter comes after cmp1's: once it is in, cmp1's trims are done.
	for ctx.Err() == nil {
		st, err := s.JS.Stream(ctx, transport.DLQStream)
		if err == nil {
			if _, err := st.GetLastMsgForSubject(ctx, transport.DLQSubject(transport.DLQFlowsSubject, transport.FlowsSubject("cmp2"))); err == nil {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e := evictions(); e != 3 {
		t.Fatalf("evictions %v, want 3", e)
	}

	code, table, errOut := runCLI("dlq", "inspect", "--config", cfgFile)
	t.Logf("tapflow dlq inspect:\n%s%s", table, errOut)
	if code != exitOK {
		t.Fatalf("inspect: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[len(lines)-3], "evicted (") {
		t.Fatalf("inspect: no eviction section after the letters")
	}
	evLine := lines[len(lines)-1]
	f := strings.Fields(evLine)
	if len(f) != 8 || f[0] != "cmp1" || f[1] != transport.FlowsStream || f[2] != "3" || f[3] != strconv.Itoa(3*len("garbage 1")) || f[6] != "cmp1-3" || f[7] != "decode=3" {
		t.Fatalf("eviction line %q (fields %q)", evLine, f)
	}
	for _, want := range []string{"cmp1-4", "cmp1-5", "cmp2-1"} {
		if !strings.Contains(table, want) {
			t.Errorf("inspect does not list letter %s", want)
		}
	}
	if strings.Contains(table, "cmp1-1 ") || !strings.Contains(errOut, "3 dead letter(s) evicted from 1 sender(s)") {
		t.Errorf("inspect: evicted letter listed, or no eviction summary: %q", errOut)
	}

	code, js, _ := runCLI("dlq", "inspect", "--config", cfgFile, "--format", "json")
	jl := strings.Split(strings.TrimSpace(js), "\n")
	var ev struct{ Evicted transport.DLQEvictions }
	if err := json.Unmarshal([]byte(jl[len(jl)-1]), &ev); code != exitOK || err != nil || len(jl) != 4 || ev.Evicted.Sender != "cmp1" || ev.Evicted.Letters != 3 || ev.Evicted.ByReason["decode"] != 3 {
		t.Fatalf("inspect json: exit %d, %v, %d lines, last %q", code, err, len(jl), jl[len(jl)-1])
	}
	for _, args := range [][]string{{"--subject", "tapflow.flows.v1.cmp2"}, {"--reason", "time"}} {
		code, out, errOut := runCLI(append([]string{"dlq", "inspect", "--config", cfgFile}, args...)...)
		if code != exitOK || strings.Contains(out, "evicted") || strings.Contains(errOut, "evicted") {
			t.Errorf("inspect %v: exit %d, shows evictions:\n%s%s", args, code, out, errOut)
		}
	}
}
