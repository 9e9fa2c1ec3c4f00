package parquet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/schemas"
)

// agentBatch returns n records of one agent batch whose time_end spreads
// over `hours` hours from base (so the batch has a piece per hour).
func agentBatch(agent string, seq int64, n, hours int, base time.Time) []schemas.Flow {
	recs := make([]schemas.Flow, n)
	for i := range recs {
		end := base.Add(time.Duration(i%hours)*time.Hour + time.Duration(i)*time.Millisecond)
		recs[i] = schemas.Flow{TimeStart: end.UnixMicro() - 1000, TimeEnd: end.UnixMicro(), AgentID: agent, BatchSeq: seq,
			RecordIndex: int32(i), Bytes: seq*1000 + int64(i), Packets: 1, TenantID: "t", Direction: "tx", Node: "n"}
	}
	return recs
}

func dedupeSink(t *testing.T, output, writer string) (env, *Sink[schemas.Flow]) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Output, cfg.Writer = output, writer
	e := env{reg: prometheus.NewRegistry(), logs: &logCounter{}}
	s, err := New(cfg, Options{Node: writer, Logger: slog.New(e.logs), Registry: e.reg, Dedupe: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.sink = s
	return e, s
}

type ident struct {
	agent string
	seq   int64
	idx   int32
}

// exactlyOnce reads every committed file under output (any writer) and
// checks each identity of want appears once and nothing else appears.
func exactlyOnce(t *testing.T, output string, want [][]schemas.Flow) {
	t.Helper()
	seen := map[ident]int{}
	files, _ := filepath.Glob(filepath.Join(output, "flows", "*", "*", "*.parquet"))
	for _, p := range files {
		for _, r := range readFile(t, p) {
			seen[ident{r.AgentID, r.BatchSeq, r.RecordIndex}]++
		}
	}
	n := 0
	for _, b := range want {
		for _, r := range b {
			n++
			id := ident{r.AgentID, r.BatchSeq, r.RecordIndex}
			if seen[id] != 1 {
				t.Fatalf("record %+v appears %d times", id, seen[id])
			}
		}
	}
	if len(seen) != n {
		t.Fatalf("%d identities in the output, %d expected", len(seen), n)
	}
}

func readFile(t *testing.T, p string) []schemas.Flow { t.Helper(); return readOutputFile(t, p) }

func TestDedupeRedeliveries(t *testing.T) {
	base := time.Date(2026, 11, 29, 10, 30, 0, 0, time.UTC)
	all := make([][]schemas.Flow, 13)
	for i := range all {
		all[i] = agentBatch("agent-a", int64(100+i), 300, 2, base)
	}
	for _, tc := range []struct {
		name string
		// first run commits these (index into all); damage simulates a
		// crash; the second run gets redeliveries plus new batches.
		first   []int
		damage  func(t *testing.T, output string)
		second  []int
		dupRecs float64
	}{
		{"restart: redelivered batches are acked, not written", seq(0, 10), nil, append(seq(3, 7), 10, 11, 12), 4 * 300},
		{"crash between the renames of one roll: only the missing hour is written", seq(0, 6), func(t *testing.T, out string) {
			// The roll renamed hour 10 and died before hour 11.
			files, _ := filepath.Glob(filepath.Join(out, "flows", "dt=2026-11-29", "hour=11", "*.parquet"))
			if len(files) != 1 {
				t.Fatalf("want one hour=11 file, got %v", files)
			}
			if err := os.Remove(files[0]); err != nil {
				t.Fatal(err)
			}
		}, seq(0, 6), 6 * 150},
		{"nothing committed: everything written", nil, nil, seq(0, 13), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			a := newAcks()
			if len(tc.first) > 0 {
				_, s1 := dedupeSink(t, out, "w1")
				r := start(context.Background(), s1)
				for i, k := range tc.first {
					r.send(a.batch(int64(i+1), slices.Clone(all[k])))
				}
				r.close(t)
			}
			if tc.damage != nil {
				tc.damage(t, out)
			}
			e2, s2 := dedupeSink(t, out, "w1")
			r := start(context.Background(), s2)
			for i, k := range tc.second {
				r.send(a.batch(int64(1000+i), slices.Clone(all[k])))
			}
			r.close(t)
			if ok, failed := a.state(); failed != 0 || ok != len(tc.first)+len(tc.second) {
				t.Fatalf("acks: %d ok, %d failed; want %d ok", ok, failed, len(tc.first)+len(tc.second))
			}
			var want [][]schemas.Flow
			for _, k := range slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(tc.first), tc.second...)))) {
				want = append(want, all[k])
			}
			exactlyOnce(t, out, want)
			if got := testutil.ToFloat64(e2.sink.m.dupRecords); got != tc.dupRecs {
				t.Fatalf("duplicate records counted %v, want %v", got, tc.dupRecs)
			}
		})
	}
}

func seq(from, to int) []int {
	var v []int
	for i := from; i < to; i++ {
		v = append(v, i)
	}
	return v
}

// TestDedupeWhileOpen: a second copy of a batch that is in an open file
// (a republish with another stream sequence) is not written, and is acked
// only when that file commits.
func TestDedupeWhileOpen(t *testing.T) {
	out := t.TempDir()
	base := time.Date(2026, 11, 29, 10, 30, 0, 0, time.UTC)
	x := agentBatch("agent-a", 7, 100, 1, base)
	_, s := dedupeSink(t, out, "w1")
	a := newAcks()
	r := start(context.Background(), s)
	r.send(a.batch(1, slices.Clone(x)), a.batch(2, slices.Clone(x)))
	r.sync(t)
	if _, acked := a.get(2); acked {
		t.Fatal("the copy was acked before the file holding the original committed")
	}
	r.close(t)
	if ok, failed := a.state(); ok != 2 || failed != 0 {
		t.Fatalf("acks %d ok %d failed", ok, failed)
	}
	exactlyOnce(t, out, [][]schemas.Flow{x})
}

// TestDedupeSeesOtherWriters: collectors sharing an output see each
// other's commits once the ledger re-lists the partition.
func TestDedupeSeesOtherWriters(t *testing.T) {
	out := t.TempDir()
	base := time.Date(2026, 11, 29, 10, 30, 0, 0, time.UTC)
	x, y := agentBatch("agent-a", 1, 50, 1, base), agentBatch("agent-b", 1, 50, 1, base)
	_, sb := dedupeSink(t, out, "wb")
	sb.ledger.refresh = 0 // re-list on every touch
	a := newAcks()
	rb := start(context.Background(), sb)
	rb.send(a.batch(1, slices.Clone(y))) // B loads the partition before A commits
	rb.sync(t)
	_, sa := dedupeSink(t, out, "wa")
	ra := start(context.Background(), sa)
	ra.send(a.batch(2, slices.Clone(x)))
	ra.close(t) // A commits x, then "dies" before acking: x is redelivered to B
	rb.send(a.batch(3, slices.Clone(x)))
	rb.close(t)
	exactlyOnce(t, out, [][]schemas.Flow{x, y})
}

func TestBatchesMetadataRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		ids  []batchID
		want string
	}{
		{nil, ""},
		{[]batchID{{"a", 5}}, "a:5"},
		{[]batchID{{"a", 5}, {"a", 6}, {"a", 7}, {"a", 9}, {"b-1", 1}}, "a:5-7,9;b-1:1"},
		{[]batchID{{"x:y", 3}}, "x:y:3"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			m := map[batchID]struct{}{}
			for _, id := range tc.ids {
				m[id] = struct{}{}
			}
			got := formatBatches(m)
			if got != tc.want {
				t.Fatalf("format = %q, want %q", got, tc.want)
			}
			back, err := parseBatches(got)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(sortIDs(back)) != fmt.Sprint(sortIDs(tc.ids)) {
				t.Fatalf("parse(%q) = %v, want %v", got, back, tc.ids)
			}
		})
	}
	for _, bad := range []string{"noagent", "a:x", "a:5-3", "a:1-99999999999"} {
		if _, err := parseBatches(bad); err == nil {
			t.Errorf("parseBatches(%q) accepted", bad)
		}
	}
}

func sortIDs(v []batchID) []batchID {
	v = slices.Clone(v)
	slices.SortFunc(v, func(a, b batchID) int {
		if a.agent != b.agent {
			if a.agent < b.agent {
				return -1
			}
			return 1
		}
		return int(a.seq - b.seq)
	})
	return v
}

func readOutputFile(t *testing.T, p string) []schemas.Flow {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	rows, err := pq.Read[schemas.Flow](f, st.Size())
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return rows
}
