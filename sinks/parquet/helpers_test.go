package parquet

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// logCounter is a slog.Handler counting records per level.
type logCounter struct {
	mu   sync.Mutex
	n    map[slog.Level]int
	msgs []string
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[slog.Level]int{}
	}
	h.n[r.Level]++
	h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
	return nil
}
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }
func (h *logCounter) count(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[l]
}

type env struct {
	sink *Sink[schemas.Flow]
	reg  *prometheus.Registry
	logs *logCounter
}

func newSink(t *testing.T, cfg Config) env {
	t.Helper()
	e := env{reg: prometheus.NewRegistry(), logs: &logCounter{}}
	s, err := New(cfg, Options{Node: "node-a", Logger: slog.New(e.logs), Registry: e.reg})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.sink = s
	return e
}

func testConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Output = t.TempDir()
	return cfg
}

// acks records how every batch ended.
type acks struct {
	mu    sync.Mutex
	err   map[int64]error // last ack of each seq
	calls map[int64]int
	hook  func(seq int64, err error)
}

func newAcks() *acks { return &acks{err: map[int64]error{}, calls: map[int64]int{}} }

func (a *acks) batch(seq int64, recs []schemas.Flow) *pipeline.Batch {
	b := pipeline.NewBatch(recs, func(err error) {
		if a.hook != nil {
			a.hook(seq, err)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.err[seq] = err
		a.calls[seq]++
	})
	b.Seq = seq
	return b
}

// state returns how many seqs were acked nil and with an error.
func (a *acks) state() (ok, failed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.err {
		if err == nil {
			ok++
		} else {
			failed++
		}
	}
	return ok, failed
}

func (a *acks) get(seq int64) (err error, acked bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	err, acked = a.err[seq]
	return err, acked
}

// batches cuts recs into batches of size with seqs from firstSeq.
func (a *acks) batches(recs []schemas.Flow, size int, firstSeq int64) []*pipeline.Batch {
	var out []*pipeline.Batch
	for i := 0; i < len(recs); i += size {
		out = append(out, a.batch(firstSeq+int64(len(out)), recs[i:min(i+size, len(recs))]))
	}
	return out
}

// run drives Sink.Run over an unbuffered channel.
type run struct {
	in   chan *pipeline.Batch
	done chan error
}

func start(ctx context.Context, s *Sink[schemas.Flow]) *run {
	r := &run{in: make(chan *pipeline.Batch), done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx, r.in) }()
	return r
}

func (r *run) send(bs ...*pipeline.Batch) {
	for _, b := range bs {
		r.in <- b
	}
}

// sync returns once the sink has processed everything sent before: an
// empty batch is acked as soon as the sink takes it, after the previous
// batch was written.
func (r *run) sync(t *testing.T) {
	t.Helper()
	done := make(chan struct{})
	r.in <- pipeline.NewBatch(nil, func(error) { close(done) })
	<-done
}

func (r *run) close(t *testing.T) {
	t.Helper()
	close(r.in)
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run returned %v, want nil", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its input closed")
	}
}

var fileName = regexp.MustCompile(`^(.+)-(\d{20})-(\d{20})(-\d+)?\.parquet$`)

type readBack struct {
	rows  []schemas.Flow
	files []string // committed files, relative to <output>/flows
	temps []string // dot files left anywhere
	bytes int64    // on disk
}

// readOutput reads every committed file under output and checks each one:
// name, partition of every row, key-value metadata.
func readOutput(t *testing.T, output, writer string) readBack {
	t.Helper()
	var rb readBack
	root := filepath.Join(output, "flows")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) && p == root {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if strings.HasPrefix(d.Name(), ".") {
			rb.temps = append(rb.temps, rel)
			return nil
		}
		rb.files = append(rb.files, rel)
		m := fileName.FindStringSubmatch(d.Name())
		if m == nil || m[1] != writer {
			t.Errorf("file %s: name is not %s-<20 digits>-<20 digits>.parquet", rel, writer)
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, _ := f.Stat()
		rb.bytes += st.Size()
		pf, err := pq.OpenFile(f, st.Size())
		if err != nil {
			t.Errorf("file %s: %v", rel, err)
			return nil
		}
		if v, _ := pf.Lookup(schemas.MetadataKey); v != schemas.SchemaName {
			t.Errorf("file %s: %s=%q, want %q", rel, schemas.MetadataKey, v, schemas.SchemaName)
		}
		if v, _ := pf.Lookup(MetadataWriter); v != writer {
			t.Errorf("file %s: %s=%q, want %q", rel, MetadataWriter, v, writer)
		}
		seqs, _ := pf.Lookup(MetadataBatchSeqs)
		first, last := seqBounds(t, seqs)
		if a, _ := strconv.ParseInt(m[2], 10, 64); a != first {
			t.Errorf("file %s: first seq in name %d, metadata %q", rel, a, seqs)
		}
		if b, _ := strconv.ParseInt(m[3], 10, 64); b != last {
			t.Errorf("file %s: last seq in name %d, metadata %q", rel, b, seqs)
		}
		rows, err := pq.Read[schemas.Flow](f, st.Size())
		if err != nil {
			t.Errorf("file %s: read rows: %v", rel, err)
			return nil
		}
		if int64(len(rows)) != pf.NumRows() || len(rows) == 0 {
			t.Errorf("file %s: read %d rows, footer says %d", rel, len(rows), pf.NumRows())
		}
		dir := filepath.Dir(rel)
		for i := range rows {
			if want := partition(hourOf(rows[i].TimeEnd)); want != dir {
				t.Errorf("file %s: row with time_end %s belongs in %s", rel, time.UnixMicro(rows[i].TimeEnd).UTC(), want)
				break
			}
		}
		rb.rows = append(rb.rows, rows...)
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return rb
}

func seqBounds(t *testing.T, ranges string) (first, last int64) {
	t.Helper()
	if ranges == "" {
		t.Errorf("empty %s", MetadataBatchSeqs)
		return -1, -1
	}
	var all []int64
	for _, r := range strings.Split(ranges, ",") {
		for _, v := range strings.SplitN(r, "-", 2) {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Errorf("%s=%q: %v", MetadataBatchSeqs, ranges, err)
			}
			all = append(all, n)
		}
	}
	return slices.Min(all), slices.Max(all)
}

// sortFlows orders records by their identity.
func sortFlows(v []schemas.Flow) {
	slices.SortFunc(v, func(a, b schemas.Flow) int {
		if c := strings.Compare(a.AgentID, b.AgentID); c != 0 {
			return c
		}
		if a.BatchSeq != b.BatchSeq {
			return int(a.BatchSeq - b.BatchSeq)
		}
		return int(a.RecordIndex - b.RecordIndex)
	})
}

func sums(v []schemas.Flow) (packets, bytes int64) {
	for i := range v {
		packets += v[i].Packets
		bytes += v[i].Bytes
	}
	return
}
