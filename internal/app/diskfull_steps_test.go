package app

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/tmpfs"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
)

// committedFiles returns the committed Parquet files under out/flows (no
// temp files) with their sizes.
func committedFiles(t *testing.T, out string) map[string]int64 {
	t.Helper()
	files := map[string]int64{}
	err := filepath.WalkDir(filepath.Join(out, "flows"), func(p string, d os.DirEntry, err error) error {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") || !strings.HasSuffix(d.Name(), ".parquet") {
			return err
		}
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		files[p] = st.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDiskFullSmallSteps: the collector's output is a 16 MiB tmpfs filled
// to the last byte while a backlog of ≈7 MiB of Parquet waits in
// JetStream. Then only 2 MiB are freed — less than the backlog, so one
// file holding all of it can never commit (before the fix every retry
// filled the disk again and 0 rows were committed). The collector must
// commit in pieces that fit: commits resume, the freed room is used, and
// no file is larger than the room. Then the rest is freed and every
// record is in Parquet exactly once. Needs root (to mount the tmpfs).
func TestDiskFullSmallSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("disk-full run: not in -short")
	}
	const (
		size    = 16 << 20
		room    = 2 << 20 // freed first: less than the backlog
		batches = 240
		perB    = 500
	)
	out := tmpfs.Mount(t, size)
	filler, full := tmpfs.Fill(t, out)

	s := transporttest.Run(t, "")
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "diskfull", t.TempDir()
	cfg.Collector.Parquet.Output = out
	// The test is about failed commits and their retries. roll_age 10s
	// (shipped 5m; ack_wait follows it) still lets the whole redelivered
	// backlog into one roll, as the shipped 5m does in production (with 1s
	// the old code's rolls were small enough by age alone), and retries
	// come after 200ms (shipped nak_delay 5s) so the episode fits the
	// test. roll_size is shipped (128MiB): the backlog is one file's worth.
	cfg.Collector.Parquet.RollAge = units.Duration(10 * time.Second)
	cfg.Collector.Consumer.NakDelay = units.Duration(200 * time.Millisecond)
	cfg.Metrics.Listen = ""
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &logSink{}
	rt := &runtime{log: slog.New(logs), reg: obs.NewRegistry(), js: s.JS, pm: pipeline.NewMetrics(nil)}
	coll, err := newCollector(cfg, rt, false)
	if err != nil {
		t.Fatal(err)
	}
	// Records that barely compress (random addresses, ports and counters),
	// so the backlog is several MiB of Parquet.
	pub, err := publish.New(s.JS, publish.Options{AgentID: "cmp1", Node: "cmp1", StateDir: t.TempDir(), NATS: transport.DefaultConfig(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch, batches)
	var want, wantBytes int64
	rnd := rand.New(rand.NewPCG(1, 2))
	ip := func() string {
		var a [4]byte
		for i := range a {
			a[i] = byte(rnd.Uint32())
		}
		return netip.AddrFrom4(a).String()
	}
	base := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour) // one hour: one file per commit
	for i := range batches {
		recs := make([]schemas.Flow, perB)
		for j := range recs {
			te := base.Add(time.Duration(i*perB+j) * time.Millisecond).UnixMicro()
			recs[j] = schemas.Flow{Node: "cmp1", TimeStart: te - rnd.Int64N(1e6), TimeEnd: te, Bytes: rnd.Int64N(1 << 40), Packets: rnd.Int64N(1 << 30),
				TenantID: "t", Zone: "external", Direction: "tx", SrcIP: ip(), DstIP: ip(), SrcPort: rnd.Int32N(65536), DstPort: rnd.Int32N(65536), Protocol: 6}
			want++
			wantBytes += recs[j].Bytes
		}
		in <- pipeline.NewBatch(recs, func(err error) {
			if err != nil {
				t.Errorf("publish: %v", err)
			}
		})
	}
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	// The collector starts with the backlog waiting: it arrives in one
	// burst, as a redelivery does.
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- coll.Run(ctx) }()
	defer func() { stop(); <-done }()

	// Full: the commit fails with ENOSPC, nothing is acked.
	deadline := time.Now().Add(40 * time.Second)
	for logs.find("no space left on device") == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no ENOSPC log line 40 s after the backlog was published; first error: %q", logs.find("ERROR"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // a few retries on the full disk
	cons, err := s.JS.Consumer(context.Background(), transport.FlowsStream, cfg.Collector.Consumer.Durable)
	if err != nil {
		t.Fatal(err)
	}
	if files := committedFiles(t, out); len(files) != 0 {
		t.Fatalf("files committed on a full disk: %v", files)
	}
	if info, err := cons.Info(context.Background()); err != nil || info.AckFloor.Stream != 0 {
		t.Fatalf("messages acked on a full disk: %+v, %v", info, err)
	}

	// A little room: less than the backlog. Commits resume in pieces that
	// fit, and use the room.
	if err := os.Truncate(filler, full-room); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	// Redeliveries come in any order: count the acked messages rather than
	// read the ack floor.
	stream, err := s.JS.Stream(context.Background(), transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	sinfo, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	var waiting uint64
	deadline = time.Now().Add(30 * time.Second)
	for {
		got = 0
		for _, n := range committedFiles(t, out) {
			got += n
		}
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		waiting = info.NumPending + uint64(info.NumAckPending)
		if got >= room/2 && waiting < sinfo.State.Msgs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after %d bytes were freed: %d bytes committed (want ≥ %d), %d of %d messages unacked: recovery needs more room than the backlog",
				room, got, room/2, waiting, sinfo.State.Msgs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("with %d KiB freed: %d KiB committed, %d of %d messages acked after %v", room>>10, got>>10, sinfo.State.Msgs-waiting, sinfo.State.Msgs, time.Since(freed).Round(time.Millisecond))
	if waiting == 0 {
		t.Fatalf("all %d messages acked with %d bytes freed: the backlog must be larger than the room for this test to mean anything", sinfo.State.Msgs, room)
	}
	for p, n := range committedFiles(t, out) {
		if n > room {
			t.Errorf("%s is %d bytes, more than the %d freed", p, n, room)
		}
	}

	// The rest of the room: everything is committed, exactly once.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		info, err := cons.Info(context.Background())
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained 60 s after the disk was emptied: %+v", info)
		}
		time.Sleep(200 * time.Millisecond)
	}
	files := committedFiles(t, out)
	seen := map[recID]bool{}
	var rows, bytes int64
	for p := range files {
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := pq.Read[schemas.Flow](fh, files[p])
		fh.Close()
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		for _, r := range recs {
			id := recID{r.AgentID, r.BatchSeq, r.RecordIndex}
			if seen[id] {
				t.Fatalf("record %+v twice", id)
			}
			seen[id] = true
			rows++
			bytes += r.Bytes
		}
	}
	if rows != want || bytes != wantBytes {
		t.Fatalf("output %d rows / %d bytes, want %d / %d", rows, bytes, want, wantBytes)
	}
	if logs.find("committing in small steps") == "" {
		t.Error("no log line saying the collector commits in small steps")
	}
	var total int64
	for _, n := range files {
		total += n
	}
	t.Logf("%d records in %d files, %d KiB", rows, len(files), total>>10)
}
