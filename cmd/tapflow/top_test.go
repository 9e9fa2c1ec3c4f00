package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/units"
)

// TestMain lets the test binary run as tapflow (TAPFLOW_TEST_MAIN=1): the
// terminal test starts it under tmux.
func TestMain(m *testing.M) {
	if os.Getenv("TAPFLOW_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// startPipeline runs `tapflow run` in-process (synthetic source → enrich →
// embedded JetStream → collector → Parquet) with metrics on a loopback
// port until the test ends, and returns the /metrics URL.
func startPipeline(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "top-node", t.TempDir()
	cfg.Metrics.Listen = addr
	cfg.Synthetic.Tenants, cfg.Synthetic.VMsPerTenant, cfg.Synthetic.LoadBalancers = 4, 6, 2
	cfg.Synthetic.FlowsPerSecond, cfg.Synthetic.RecordsPerSecond = 500, 5000
	cfg.Synthetic.BatchRecords = 500
	cfg.Synthetic.BatchMaxAge = units.Duration(200 * time.Millisecond)
	cfg.Collector.Parquet.RollAge = units.Duration(time.Second)
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunAll(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("run did not stop within 1m")
		}
	})
	url := "http://" + addr + "/metrics"
	deadline := time.Now().Add(60 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return url
		}
		select {
		case err := <-done:
			t.Fatalf("run stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metrics listener on %s after 60s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stageRow matches a rendered row of a pipeline stage with its IN/s and
// OUT/s columns.
var stageRow = regexp.MustCompile(`(?m)^\s*(\S+)\s+(agent|collector)\s+(\S+|source \(synthetic\))\s+([0-9.]+[kM]?)\s+([0-9.]+[kM]?)\s`)

// TestTopUnderTmux draws `tapflow top` in a real terminal (a tmux pane,
// 160×40) against two running pipelines and a third endpoint that is down,
// then reads the screen back (capture-pane): every stage of the agent and
// the collector of both is a row, the records flow (non-zero in/s and out/s on
// enrich, the publisher and the Parquet sink, non-zero out/s on the
// source), and the dead endpoint is
// shown as DOWN while the live one keeps updating.
func TestTopUnderTmux(t *testing.T) {
	tmux := prereq.Command(t, "tmux", "make deps (deploy/scripts/deps.sh) installs Debian's tmux package")
	url, url2 := startPipeline(t), startPipeline(t)
	dead := deadURL(t)
	sock := fmt.Sprintf("tapflow-top-%d", os.Getpid())
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-L", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("env TAPFLOW_TEST_MAIN=1 %s top --metrics %s,%s,%s --interval 1s; sleep 60", self, url, url2, dead)
	if out, err := tm("new-session", "-d", "-x", "160", "-y", "40", "-s", "top", cmd); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = tm("kill-server") })

	want := map[string]bool{}
	for _, u := range []string{url, url2} {
		for _, st := range []string{"source (synthetic)", "enrich", "publish", "parquet"} {
			want[strings.TrimSuffix(strings.TrimPrefix(u, "http://"), "/metrics")+" "+st] = false
		}
	}
	var screen string
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		if screen, err = tm("capture-pane", "-p", "-t", "top"); err != nil {
			t.Fatalf("capture-pane: %v\n%s", err, screen)
		}
		for _, m := range stageRow.FindAllStringSubmatch(screen, -1) {
			k := m[1] + " " + m[3]
			if _, ok := want[k]; ok && m[5] != "0" && (m[4] != "0" || m[3] == "source (synthetic)") {
				want[k] = true
			}
		}
		all := true
		for _, ok := range want {
			all = all && ok
		}
		if all && strings.Contains(screen, "DOWN "+dead) {
			t.Logf("tapflow top under tmux (160x40):\n%s", screen)
			return
		}
	}
	t.Fatalf("screen after 90s: stages with non-zero in/out %v, DOWN %s shown %v:\n%s", want, dead, strings.Contains(screen, "DOWN "+dead), screen)
}

// deadURL is a loopback /metrics URL nothing listens on.
func deadURL(t *testing.T) string { return "http://" + freeAddr(t) + "/metrics" }

// TestTopOnce: --once prints one plain view (no escape codes) and exits 0;
// bad flags exit 2 naming the fix.
func TestTopOnce(t *testing.T) {
	url := startPipeline(t)
	tests := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"top", "--once", "--interval", "1s", "--metrics", url}, exitOK, "PIPELINE"},
		{[]string{"top", "--metrics", "ftp://x"}, exitUsage, "is not an http(s) URL"},
		{[]string{"top", "--interval", "1ms"}, exitUsage, "below 100ms"},
		{[]string{"top", "extra"}, exitUsage, "unexpected argument"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb strings.Builder
			if code := run(tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out.String(), errb.String())
			}
			if s := out.String() + errb.String(); !strings.Contains(s, tc.contains) || strings.Contains(s, "\x1b[") {
				t.Fatalf("output lacks %q or has escape codes:\n%s", tc.contains, s)
			}
		})
	}
}
