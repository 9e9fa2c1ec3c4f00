package parquet

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/tapflow/tapflow/internal/fsx"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

type countingWriter struct {
	f     *os.File
	n     int64
	calls int64 // write(2) calls
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	c.n += int64(n)
	c.calls++
	return n, err
}

func (s *Sink[T]) write(b *pipeline.BatchOf[T]) {
	recs := b.Records
	// Whatever becomes of b, its rows are not read after this write: the
	// column writers copied what they took (and a retry is a redelivery,
	// decoded anew). b lets go of them too, so nothing can read recycled
	// buffers through it.
	defer func(all []T) {
		b.Records = nil
		s.release(all)
	}(recs)
	if len(recs) == 0 {
		b.Ack(nil) // nothing to make durable
		return
	}
	if err := s.checkHours(b); err != nil {
		s.reject(b, err)
		return
	}
	if s.ledger != nil {
		var err error
		if recs, err = s.dedupe(recs); err != nil {
			s.m.commitErrors.Inc()
			if now := time.Now(); now.Sub(s.dedupLog.at) > 30*time.Second {
				s.log.Warn("cannot tell whether a batch is already committed; failed for redelivery", "seq", b.Seq, "err", err,
					"same_failures_not_logged", s.dedupLog.suppressed)
				s.dedupLog.at, s.dedupLog.suppressed = now, 0
			} else {
				s.dedupLog.suppressed++
			}
			b.Ack(fmt.Errorf("parquet sink %s: dedupe: %w", s.root, err))
			return
		}
		if len(recs) == 0 {
			// Every record is committed (or in an open file: then wait for
			// that file's commit before acking).
			if len(s.files) > 0 {
				s.hold(b)
			} else {
				b.Ack(nil)
			}
			return
		}
	}
	timeEnd := s.schema.TimeEnd
	s.hours = s.hours[:0]
	last := int64(math.MinInt64)
	for i := range recs {
		if h := hourOf(timeEnd(&recs[i])); h != last {
			if !slices.Contains(s.hours, h) {
				s.hours = append(s.hours, h)
			}
			last = h
		}
	}
	opening := 0
	for _, h := range s.hours {
		if s.files[h] == nil {
			opening++
		}
	}
	if opening > 0 && len(s.files) > 0 && len(s.files)+opening > s.cfg.MaxOpenFiles {
		s.roll("max open files")
	}
	if s.step > 0 && len(s.files) > 0 && s.openEstimate()+int64(float64(len(recs))*s.bpr) > s.stepBudget() {
		s.roll("small step after a full disk")
	}

	// b is not held (acks) until its last record is written: a commit
	// forced while it is being written (it spans more hours than
	// MaxOpenFiles) must not ack it; fail acks it with the others.
	s.cur = b
	for i := 0; i < len(recs); {
		h := hourOf(timeEnd(&recs[i]))
		j := i + 1
		for j < len(recs) && hourOf(timeEnd(&recs[j])) == h {
			j++
		}
		f := s.files[h]
		if f == nil {
			if len(s.files) >= s.cfg.MaxOpenFiles {
				// Commit before opening more: the batch's earlier hours are
				// durable now (the ledger knows them: a redelivery skips
				// them); the batch is acked with the commit of its last.
				s.roll("max open files within a batch")
				if s.cur == nil {
					return // the commit failed, and b with it
				}
			}
			var err error
			if f, err = s.open(h); err != nil {
				s.fail(err)
				return
			}
		}
		if n := len(f.seqs); n == 0 || f.seqs[n-1] != b.Seq {
			f.seqs = append(f.seqs, b.Seq)
		}
		if s.ledger != nil {
			s.notePieces(f, recs[i:j])
		}
		if err := s.writeRows(f, recs[i:j]); err != nil {
			s.fail(err)
			return
		}
		i = j
	}
	s.cur = nil
	s.hold(b)
	for i := range recs {
		s.ends.note(timeEnd(&recs[i]))
	}
	for _, f := range s.files {
		if f.estimate(s.bpr) >= int64(s.cfg.RollSize) {
			s.roll("size")
			return
		}
	}
	if s.step > 0 && s.openEstimate() >= s.stepBudget() {
		s.roll("small step after a full disk")
	} else if s.commitDue != nil && len(s.files) > 0 {
		if r := s.commitDue(); r != "" {
			s.roll("early: " + r)
		}
	}
}

// hold keeps b's ack until the next commit and lets go of its records:
// they are in the open files' row groups now, and the ack is all a commit
// needs. Holding the decoded records until the commit made the collector's
// memory grow with roll_size × max_open_files (GBs at the defaults).
func (s *Sink[T]) hold(b *pipeline.BatchOf[T]) {
	s.acks.Add(b)
	b.Records = nil
}

// release gives a row batch's decode buffers back to their pool
// (schemas.ReleaseRows) once the sink is done with its rows; a no-op for
// record structs and rows of decoders without a pool.
func (s *Sink[T]) release(recs []T) {
	if s.schema.rows == nil {
		return
	}
	if rows, ok := any(recs).([]schemas.Row); ok {
		schemas.ReleaseRows(rows)
	}
}

// Partitions the sink creates: time_end in [MinTimeEnd, MaxTimeEnd). A
// record outside (a clock reset to 1970, a corrupt or hostile time_end
// such as year −144169) would make a bogus partition directory; the
// collector's source dead-letters such messages first, and the sink
// refuses what still gets through.
var (
	MinTimeEnd = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTimeEnd = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

var (
	minHour = hourOf(MinTimeEnd.UnixMicro())
	maxHour = hourOf(MaxTimeEnd.UnixMicro()) // exclusive
)

// checkHours refuses a batch with a record outside [MinTimeEnd,
// MaxTimeEnd), and groups b's records by hour (a stable sort, only when
// an hour comes back after another) so each hour's records of the batch —
// one dedupe piece — are written as one run into one file.
func (s *Sink[T]) checkHours(b *pipeline.BatchOf[T]) error {
	recs, timeEnd := b.Records, s.schema.TimeEnd
	clear(s.seen)
	grouped := true
	last := int64(math.MinInt64)
	for i := range recs {
		us := timeEnd(&recs[i])
		h := hourOf(us)
		if h == last {
			continue
		}
		if h < minHour || h >= maxHour {
			return &RangeError{Seq: b.Seq, Index: i, TimeEnd: us}
		}
		if _, ok := s.seen[h]; ok {
			grouped = false
		}
		s.seen[h] = struct{}{}
		last = h
	}
	if !grouped {
		slices.SortStableFunc(recs, func(a, b T) int { return cmp.Compare(hourOf(timeEnd(&a)), hourOf(timeEnd(&b))) })
	}
	return nil
}

// reject acks b with err (a batch that must not be written at all),
// counts it and logs it (at most every 30 s, with the count of others).
func (s *Sink[T]) reject(b *pipeline.BatchOf[T], err error) {
	s.m.rejected.Inc()
	if now := time.Now(); now.Sub(s.rejLog.at) > 30*time.Second {
		s.log.Error("batch refused: not written", "seq", b.Seq, "records", len(b.Records), "err", err, "same_refusals_not_logged", s.rejLog.suppressed)
		s.rejLog.at, s.rejLog.suppressed = now, 0
	} else {
		s.rejLog.suppressed++
	}
	b.Ack(fmt.Errorf("parquet sink %s: %w", s.root, err))
}

// estimate is the size the file would have if committed now.
func (f *file[T]) estimate(bpr float64) int64 {
	if f.flushedRows > 0 {
		bpr = float64(f.out.n) / float64(f.flushedRows)
	}
	return f.out.n + int64(float64(f.rows-f.flushedRows)*bpr)
}

func (s *Sink[T]) writeRows(f *file[T], rows []T) error {
	limit := int64(s.cfg.RowGroupRows)
	for len(rows) > 0 {
		n := min(int64(len(rows)), limit-f.groupRows)
		if _, err := f.w.Write(rows[:n]); err != nil {
			return commitError("write", f.tmp, err)
		}
		f.rows += n
		f.groupRows += n
		rows = rows[n:]
		if f.groupRows >= limit {
			if err := f.w.Flush(); err != nil {
				return commitError("write", f.tmp, err)
			}
			f.flushedRows, f.groupRows = f.rows, 0
		}
	}
	return nil
}

func (s *Sink[T]) open(hour int64) (*file[T], error) {
	dir := filepath.Join(s.root, partition(hour))
	if err := s.mkdir(dir); err != nil {
		return nil, err
	}
	s.tmpSeq++
	tmp := filepath.Join(dir, fmt.Sprintf(".%s@%s-%d.parquet.tmp", s.writer, s.nonce, s.tmpSeq))
	fd, err := fsx.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fsx.DataFile, s.gid)
	if err != nil {
		return nil, commitError("create", tmp, err)
	}
	f := &file[T]{hour: hour, dir: dir, tmp: tmp, f: fd}
	f.out.f = fd
	f.w = s.newFileWriter(&f.out)
	if len(s.files) == 0 {
		s.startTimer()
	}
	s.files[hour] = f
	s.m.open.Set(float64(len(s.files)))
	return f, nil
}

// mkdir creates dir and its missing parents, remembering the parents whose
// entries must be fsynced at the next commit.
func (s *Sink[T]) mkdir(dir string) error {
	st, err := os.Stat(dir)
	if err == nil {
		if !st.IsDir() {
			return commitError("mkdir", dir, syscall.ENOTDIR)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := s.mkdir(parent); err != nil {
			return err
		}
	}
	if err := fsx.Mkdir(dir, fsx.DataDir, s.gid); err != nil {
		return commitError("mkdir", dir, err)
	}
	s.syncDirs[parent] = struct{}{}
	return nil
}
