package app

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// TestCollectorMemoryLimit: a collector process gets a soft memory limit
// from its settings (2 sinks' open files + in-flight messages + runtime),
// and GOMEMLIMIT, when set, wins.
func TestCollectorMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name   string
		change func(*config.Config)
		env    string
		want   int64
	}{
		{name: "defaults", want: 1408 << 20},
		{name: "fewer open files, smaller messages, smaller pulls", change: func(c *config.Config) {
			c.Collector.Parquet.MaxOpenFiles = 2
			c.Collector.Consumer.MaxMessageBytes = 16 << 20
			c.Collector.Consumer.FetchBatch = 8
		}, want: 2*2*(16+16)<<20 + 4*16<<20 + 8*8<<20 + 2*32<<20 + 64<<20},
		{name: "row groups capped by roll_size", change: func(c *config.Config) {
			c.Collector.Parquet.RowGroupRows = 1 << 20 // 64 MiB estimated, above roll_size
			c.Collector.Parquet.RollSize = 8 << 20
			c.Collector.Parquet.MaxOpenFiles = 4
		}, want: 2*4*(16+8)<<20 + 4*64<<20 + 64*8<<20 + 2*32<<20 + 64<<20},
		{name: "GOMEMLIMIT wins", env: "300MiB", want: 300 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Collector.Parquet.Output = t.TempDir()
			if tc.change != nil {
				tc.change(&cfg)
			}
			if err := cfg.Collector.Parquet.Validate(); err != nil {
				t.Fatal(err)
			}
			t.Setenv("GOMEMLIMIT", tc.env)
			if tc.env != "" {
				debug.SetMemoryLimit(tc.want) // what the runtime read from the variable at start
			}
			if got := setCollectorMemoryLimit(cfg, log); got != tc.want {
				t.Fatalf("limit %d MiB; want %d MiB", got>>20, tc.want>>20)
			}
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Fatalf("runtime limit %d MiB; want %d MiB", got>>20, tc.want>>20)
			}
		})
	}
}

// procStatusKiB reads a "VmRSS:"-style field of /proc/<pid>/status.
func procStatusKiB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// TestCollectorProcessMemoryBounded runs the real collector binary (not
// under the race detector) against a real nats-server and pushes
// decoded columns worth ≥ 10× what its settings let the open files
// buffer (Config.MemoryEstimate) through it, every message spanning
// max_open_files hours (the worst case: every file open all the time).
// The process's peak RSS must stay under the soft memory limit the
// collector derives from those settings (collectorMemoryLimit), and
// every record must be committed once.
func TestCollectorProcessMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and pushes ~2 M records: not in -short")
	}
	bin, natsBin := chaosBinaries(t)
	dir := t.TempDir()
	nsrv := newNATSProc(t, natsBin, dir)
	nsrv.start(t)
	defer nsrv.Close()

	const (
		node      = "memnode"
		perMsg    = 16384
		openFiles = 4
	)
	cfg := config.Default()
	cfg.Collector.Parquet.Output = filepath.Join(dir, "out")
	cfg.Collector.Parquet.MaxOpenFiles = openFiles
	cfg.Collector.Parquet.RowGroupRows = 8192
	cfg.Collector.Consumer.MaxMessageBytes = 16 << 20
	cfg.Collector.Consumer.FetchBatch = 8
	estimate := cfg.Collector.Parquet.MemoryEstimate()
	limit := collectorMemoryLimit(cfg)
	yaml := fmt.Sprintf(`node: %s
data_dir: %s
nats:
  url: nats://%s
collector:
  output: %s
  max_open_files: %d
  row_group_rows: %d
  max_message_bytes: 16MiB
  fetch_batch: 8
  # shipped 5m: the files stay open through the push (the worst case
  # measured), then commit within the test's wait
  roll_age: 20s
metrics:
  listen: ""
log:
  format: json
`, node, filepath.Join(dir, "data"), nsrv.addr, cfg.Collector.Parquet.Output, openFiles, cfg.Collector.Parquet.RowGroupRows)
	cfgPath := filepath.Join(dir, "collector.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "collector.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "collector", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=") // the collector's own limit, not the test's
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	nc, err := nats.Connect("nats://" + nsrv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	jsc, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The collector creates the streams and its consumer at start.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := jsc.Consumer(ctx, transport.FlowsStream, cfg.Collector.Consumer.Durable)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("collector consumer not created after 2 min: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The peak RSS, sampled while the data goes through (VmHWM at the
	// end covers what sampling misses).
	var peakKiB atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if kib, err := procStatusKiB(cmd.Process.Pid, "VmHWM"); err == nil && kib > peakKiB.Load() {
				peakKiB.Store(kib)
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	now := time.Now().UTC()
	base := parquettest.Flows(parquettest.Spec{Records: perMsg, Start: now.Truncate(time.Hour).Add(-openFiles * time.Hour), Span: openFiles*time.Hour - time.Minute})
	slices.SortFunc(base, func(a, b schemas.Flow) int { return cmp.Compare(a.TimeEnd, b.TimeEnd) })
	// One message body, encoded once: codec none, so batch_seq is a
	// plain int64 column in the body, patched in place per message (the
	// race detector makes encoding 2 M records take minutes on a loaded
	// box). The body is exactly what the collector decodes to.
	const sentinel = int64(0x7a5e_1f00_dead_0001)
	for i := range base {
		base[i].Node, base[i].AgentID, base[i].BatchSeq, base[i].RecordIndex = node, node, sentinel, int32(i)
	}
	plain, err := schemas.NewEncoder(schemas.CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	body, err := plain.Encode(nil, base)
	if err != nil {
		t.Fatal(err)
	}
	var mark [8]byte
	binary.LittleEndian.PutUint64(mark[:], uint64(sentinel))
	var seqAt []int
	for off := 0; ; {
		i := bytes.Index(body[off:], mark[:])
		if i < 0 {
			break
		}
		seqAt = append(seqAt, off+i)
		off += i + 8
	}
	if len(seqAt) != perMsg {
		t.Fatalf("found the batch_seq sentinel %d times in the body; want once per record (%d): the wire layout changed, fix the test", len(seqAt), perMsg)
	}
	perMsgColumns := int64(len(body))
	msgs := int(10*estimate/perMsgColumns) + 1
	for k := range msgs {
		seq := int64(k + 1)
		for _, off := range seqAt {
			binary.LittleEndian.PutUint64(body[off:], uint64(seq))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = jsc.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject(node), Data: body}, jetstream.WithMsgID(fmt.Sprintf("%s-%d", node, seq)))
		cancel()
		if err != nil {
			t.Fatalf("publish %d: %v", seq, err)
		}
	}
	sent := int64(msgs) * perMsgColumns
	t.Logf("published %d messages of %d records: %d MiB of columns = %.1f× the open files' estimate (%d MiB); soft limit %d MiB",
		msgs, perMsg, sent>>20, float64(sent)/float64(estimate), estimate>>20, limit>>20)

	deadline = time.Now().Add(5 * time.Minute)
	for {
		idle, state := nsrv.consumerIdle(t, cfg.Collector.Consumer.Durable)
		if idle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector did not commit everything within 5 min: %s", state)
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stopSampling)
	<-sampled
	if kib, err := procStatusKiB(cmd.Process.Pid, "VmHWM"); err == nil && kib > peakKiB.Load() {
		peakKiB.Store(kib)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("collector exited with %v\n%s", err, b)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("collector did not stop within 2 min of SIGTERM")
	}
	if b, _ := os.ReadFile(logf.Name()); !strings.Contains(string(b), "soft memory limit set") {
		t.Errorf("collector log does not say it set its soft memory limit:\n%s", b)
	}

	var rows int64
	files, _ := filepath.Glob(filepath.Join(cfg.Collector.Parquet.Output, "flows", "*", "*", "*.parquet"))
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		pf, err := pq.OpenFile(f, st.Size())
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		rows += pf.NumRows()
		f.Close()
	}
	if want := int64(msgs) * perMsg; rows != want {
		t.Fatalf("%d rows committed in %d files; want %d (every record once)", rows, len(files), want)
	}
	peak := peakKiB.Load() << 10
	t.Logf("collector peak RSS %d MiB (soft limit %d MiB, open files' estimate %d MiB); %d rows in %d files", peak>>20, limit>>20, estimate>>20, rows, len(files))
	if peak > limit {
		t.Errorf("collector peak RSS %d MiB is above its soft memory limit %d MiB after %d MiB of columns went through", peak>>20, limit>>20, sent>>20)
	}
}
