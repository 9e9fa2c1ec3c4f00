// Package examples holds the example NATS subscribers (go-subscriber: its
// own module; js-subscriber: node) and this test, which runs both against
// a real stream. Nothing here is product code.
package examples

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
)

var zones = []string{"same_tenant", "other_tenant", "shared", "external", "infra", "multicast", "miss"}

// batches are what the agents publish: 3 batches of 4000 records over 5
// tenants and every zone; want is Σ bytes by tenant × zone.
func batches() (out [][]schemas.Flow, want map[[2]string]int64) {
	want = map[[2]string]int64{}
	k := 0
	for range 3 {
		recs := make([]schemas.Flow, 4000)
		for i := range recs {
			k++
			r := schemas.Flow{Node: "cmp1", TenantID: fmt.Sprintf("tenant-%d", k%5), Zone: zones[(k/5)%len(zones)],
				Direction: []string{"tx", "rx"}[k%2], Bytes: int64(k*37%9000 + 60), Packets: 1, TimeEnd: time.Now().UnixMicro()}
			recs[i] = r
			want[[2]string{r.TenantID, r.Zone}] += r.Bytes
		}
		out = append(out, recs)
	}
	return out, want
}

// publishAll publishes bs as a fleet in a rolling upgrade: the first
// batch from an agent of before wire dictionaries (plain utf8 strings),
// the rest from a current one (dictionary-encoded strings), so every
// subscriber reads both forms.
func publishAll(t *testing.T, s *transporttest.Server, codec string, bs [][]schemas.Flow) {
	t.Helper()
	cfg := transport.DefaultConfig()
	cfg.Codec = codec
	for i, part := range [][][]schemas.Flow{bs[:1], bs[1:]} {
		pub, err := publish.New(s.JS, publish.Options{AgentID: "agent-cmp1-" + strconv.Itoa(i), Node: "cmp1", StateDir: t.TempDir(), NATS: cfg,
			Logger: slog.New(slog.DiscardHandler), PlainStrings: i == 0})
		if err != nil {
			t.Fatal(err)
		}
		in := make(chan *pipeline.Batch, len(part))
		for _, b := range part {
			in <- pipeline.NewBatch(b, func(err error) {
				if err != nil {
					t.Errorf("publish: %v", err)
				}
			})
		}
		close(in)
		if err := pub.Run(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
}

// lockedBuffer collects a process's stderr while the test polls it.
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

// buildGo builds the Go example (its own module) into dir.
func buildGo(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "go-subscriber")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = "go-subscriber"
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/go-subscriber: %v\n%s", err, out)
	}
	return bin
}

// npmCI installs the JS example's locked dependencies when they are
// missing (make test does it first: make examples-deps).
func npmCI(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("js-subscriber/node_modules/apache-arrow/package.json"); err == nil {
		return
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = "js-subscriber"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in examples/js-subscriber (node and npm come from Debian's nodejs and npm packages; make deps installs them): %v\n%s", err, out)
	}
}

func TestExampleSubscribers(t *testing.T) {
	bin := buildGo(t, t.TempDir())
	npmCI(t)
	bs, want := batches()
	total := 0
	for _, b := range bs {
		total += len(b)
	}
	for _, tc := range []struct {
		example, codec, durable string
	}{
		{"go", schemas.CodecZstd, ""},
		{"go", schemas.CodecArrowZstd, "analytics-go"},
		{"go", schemas.CodecLZ4, ""},
		{"go", schemas.CodecNone, ""},
		{"js", schemas.CodecZstd, "analytics-js"},
		{"js", schemas.CodecArrowZstd, ""},
		{"js", schemas.CodecLZ4, ""},
		{"js", schemas.CodecNone, ""},
	} {
		name := tc.example + "/" + tc.codec
		if tc.durable != "" {
			name += "/durable"
		}
		t.Run(name, func(t *testing.T) {
			s := transporttest.Run(t, "")
			args := []string{"--server", s.ClientURL(), "--records", strconv.Itoa(total)}
			if tc.durable != "" {
				args = append(args, "--durable", tc.durable)
			}
			var cmd *exec.Cmd
			switch tc.example {
			case "go":
				cmd = exec.Command(bin, args...)
			case "js":
				cmd = exec.Command("node", append([]string{"subscriber.mjs"}, args...)...)
				cmd.Dir = "js-subscriber"
			}
			var stdout bytes.Buffer
			var stderr lockedBuffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			// Publish only once the subscriber is attached: both start at
			// new messages.
			deadline := time.Now().Add(60 * time.Second)
			for !strings.Contains(stderr.String(), "subscribed to TAPFLOW_FLOWS") {
				select {
				case err := <-done:
					t.Fatalf("%s example exited before subscribing: %v\n%s", tc.example, err, stderr.String())
				case <-time.After(10 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s example did not subscribe within 60s:\n%s", tc.example, stderr.String())
				}
			}
			publishAll(t, s, tc.codec, bs)
			deadline = time.Now().Add(90 * time.Second)
		wait:
			for {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("%s example: %v\n%s", tc.example, err, stderr.String())
					}
					break wait
				case <-time.After(20 * time.Millisecond):
				}
				if strings.Contains(stderr.String(), "skipping") || time.Now().After(deadline) {
					t.Fatalf("%s example did not read every batch; stderr:\n%s", tc.example, stderr.String())
				}
			}
			got := parseTable(t, stdout.String())
			if len(got) != len(want) {
				t.Errorf("%d tenant × zone rows, want %d:\n%s", len(got), len(want), stdout.String())
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s × %s: %d bytes, want %d", k[0], k[1], got[k], v)
				}
			}
			if strings.Contains(stderr.String(), "skipping") {
				t.Errorf("the example skipped messages:\n%s", stderr.String())
			}
			// The collector's durable still holds every batch: the
			// subscriber took nothing from it.
			cons, err := s.JS.Consumer(context.Background(), transport.FlowsStream, transport.DefaultDurable)
			if err != nil {
				t.Fatal(err)
			}
			info, err := cons.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if info.NumPending != uint64(len(bs)) || info.Delivered.Consumer != 0 {
				t.Fatalf("collector durable: %d pending, %d delivered; want %d pending, none taken", info.NumPending, info.Delivered.Consumer, len(bs))
			}
		})
	}
}

// parseTable reads "tenant zone bytes" lines after the header.
func parseTable(t *testing.T, out string) map[[2]string]int64 {
	t.Helper()
	got := map[[2]string]int64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first {
			if len(f) != 3 || f[0] != "tenant_id" {
				t.Fatalf("no header line:\n%s", out)
			}
			continue
		}
		if len(f) != 3 {
			t.Fatalf("bad line %q", sc.Text())
		}
		n, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			t.Fatalf("bad bytes in %q", sc.Text())
		}
		got[[2]string{f[0], f[1]}] = n
	}
	return got
}
