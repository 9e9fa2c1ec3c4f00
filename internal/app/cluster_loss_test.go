package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// keepOnFailure copies dir (process logs, cluster stores, output) to a
// directory that outlives the test when the test fails, and says where.
// Call it right after t.TempDir(): cleanups run last-registered first, so
// it runs after the processes are stopped and before dir is removed.
func keepOnFailure(t testing.TB, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// Sub-test names hold '/', which MkdirTemp refuses in a pattern.
		keep, err := os.MkdirTemp("", "tapflow-"+strings.ReplaceAll(t.Name(), "/", "_")+"-failed-")
		if err != nil {
			t.Logf("cannot keep the logs of the failed run: %v", err)
			return
		}
		if err := os.CopyFS(keep, os.DirFS(dir)); err != nil {
			t.Logf("keeping the logs of the failed run in %s: %v (partial copy)", keep, err)
			return
		}
		t.Logf("logs, cluster stores and output of the failed run kept in %s", keep)
	})
}

// ackedBatch is one "batch acknowledged by JetStream" line of an agent
// log (the publisher logs it at debug level).
type ackedBatch struct {
	seq       int64
	streamSeq uint64
	records   int
	at        string
}

// agentLog is what an agent log says about its batches: every batch
// JetStream acknowledged (first ack wins: a replay's duplicate ack names
// the same stream sequence) and the records each run generated.
type agentLog struct {
	acked map[int64]ackedBatch
	runs  []int64
}

func readAgentLog(path string) (agentLog, error) {
	l := agentLog{acked: map[int64]ackedBatch{}}
	f, err := os.Open(path)
	if err != nil {
		return l, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Time      string `json:"time"`
			Msg       string `json:"msg"`
			MsgID     string `json:"msg_id"`
			StreamSeq uint64 `json:"stream_seq"`
			Records   int64  `json:"records"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line.Msg {
		case "synthetic source stopped":
			l.runs = append(l.runs, line.Records)
		case "batch acknowledged by JetStream":
			i := strings.LastIndexByte(line.MsgID, '-')
			seq, err := strconv.ParseInt(line.MsgID[i+1:], 10, 64)
			if i < 0 || err != nil {
				return l, fmt.Errorf("%s: msg_id %q is not <agent>-<batch_seq>", path, line.MsgID)
			}
			if _, ok := l.acked[seq]; !ok {
				l.acked[seq] = ackedBatch{seq: seq, streamSeq: line.StreamSeq, records: int(line.Records), at: line.Time}
			}
		}
	}
	return l, sc.Err()
}

// committedStreamSeqs reads tapflow.batch_seqs (the JetStream stream
// sequences whose records a file holds) of every committed flow file
// under out.
func committedStreamSeqs(out string) (map[uint64]struct{}, error) {
	seqs := map[uint64]struct{}{}
	err := filepath.WalkDir(filepath.Join(out, "flows"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		pf, err := pq.OpenFile(f, st.Size(), pq.SkipPageIndex(true), pq.SkipBloomFilters(true))
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		v, _ := pf.Lookup(parquet.MetadataBatchSeqs)
		for _, r := range strings.Split(v, ",") {
			if r == "" {
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			a, err := strconv.ParseUint(lo, 10, 64)
			b := a
			if err == nil && ok {
				b, err = strconv.ParseUint(hi, 10, 64)
			}
			if err != nil {
				return fmt.Errorf("%s: %s %q: %w", p, parquet.MetadataBatchSeqs, v, err)
			}
			for s := a; s <= b; s++ {
				seqs[s] = struct{}{}
			}
		}
		return nil
	})
	return seqs, err
}

// lossReport says, per agent, which batches are short in the output: by
// batch_seq range, with the stream sequences JetStream acknowledged them
// under and whether any committed file claims those stream sequences.
// That tells a batch never acknowledged (agent side) from one stored in
// JetStream and lost on the way to Parquet (consumer, collector), and a
// stream sequence a file claims without its rows (the collector's dedupe).
func lossReport(rows []schemas.Flow, agentLogs map[string]string, out string) string {
	have := map[string]map[int64]map[int32]struct{}{}
	for _, r := range rows {
		a := have[r.AgentID]
		if a == nil {
			a = map[int64]map[int32]struct{}{}
			have[r.AgentID] = a
		}
		if a[r.BatchSeq] == nil {
			a[r.BatchSeq] = map[int32]struct{}{}
		}
		a[r.BatchSeq][r.RecordIndex] = struct{}{}
	}
	committed, cerr := committedStreamSeqs(out)
	var b strings.Builder
	if cerr != nil {
		fmt.Fprintf(&b, "reading the files' %s: %v\n", parquet.MetadataBatchSeqs, cerr)
	}
	agents := make([]string, 0, len(agentLogs))
	for a := range agentLogs {
		agents = append(agents, a)
	}
	slices.Sort(agents)
	for _, agent := range agents {
		l, err := readAgentLog(agentLogs[agent])
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", agent, err)
			continue
		}
		var generated, ackedRecs, outRecs int64
		for _, n := range l.runs {
			generated += n
		}
		for _, ids := range have[agent] {
			outRecs += int64(len(ids))
		}
		seqs := make([]int64, 0, len(l.acked))
		for s, a := range l.acked {
			seqs = append(seqs, s)
			ackedRecs += int64(a.records)
		}
		slices.Sort(seqs)
		unacked := 0
		for s := range have[agent] {
			if _, ok := l.acked[s]; !ok {
				unacked++
			}
		}
		fmt.Fprintf(&b, "%s: generated %d (runs %v), acknowledged by JetStream %d records in %d batches, in output %d; %d batches in the output without an ack line\n",
			agent, generated, l.runs, ackedRecs, len(seqs), outRecs, unacked)
		// Runs of consecutive acked batches (in batch_seq order) that are
		// short in the output, by whether a file claims their stream seq.
		type span struct {
			first, last    ackedBatch
			batches        int
			missing        int64
			claimed, whole int // batches whose stream seq a file claims; batches with no row at all
		}
		var spans []span
		var cur *span
		for _, s := range seqs {
			a := l.acked[s]
			got := len(have[agent][s])
			if got >= a.records {
				cur = nil
				continue
			}
			if cur == nil {
				spans = append(spans, span{first: a})
				cur = &spans[len(spans)-1]
			}
			cur.last = a
			cur.batches++
			cur.missing += int64(a.records - got)
			if _, ok := committed[a.streamSeq]; ok {
				cur.claimed++
			}
			if got == 0 {
				cur.whole++
			}
		}
		for i, sp := range spans {
			if i == 20 {
				fmt.Fprintf(&b, "  … %d more short ranges\n", len(spans)-i)
				break
			}
			fmt.Fprintf(&b, "  short: batch_seq %d-%d (%d batches, %d with no row, %d records missing), acked as stream seq %d-%d at %s .. %s; a committed file claims the stream seq of %d of them\n",
				sp.first.seq, sp.last.seq, sp.batches, sp.whole, sp.missing, sp.first.streamSeq, sp.last.streamSeq, sp.first.at, sp.last.at, sp.claimed)
		}
		if d := generated - ackedRecs; d != 0 {
			fmt.Fprintf(&b, "  generated minus acknowledged: %d records (never acknowledged by JetStream, or spooled and not replayed)\n", d)
		}
	}
	return b.String()
}

// timeline is the test's schedule with wall-clock times, to hold against
// the ack times of a lossReport.
type timeline []string

func (tl *timeline) add(format string, args ...any) {
	*tl = append(*tl, time.Now().UTC().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}
