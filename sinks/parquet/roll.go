package parquet

import (
	"cmp"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func (s *Sink[T]) startTimer() {
	if s.timer == nil {
		s.timer = time.NewTimer(s.cfg.RollAge.D())
	} else {
		s.timer.Reset(s.cfg.RollAge.D())
	}
	s.timerC = s.timer.C
}

func (s *Sink[T]) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerC = nil
}

// roll commits every open file, then acks every batch held.
func (s *Sink[T]) roll(reason string) {
	s.stopTimer()
	if len(s.files) == 0 {
		return
	}
	files := make([]*file[T], 0, len(s.files))
	for _, f := range s.files {
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b *file[T]) int { return cmp.Compare(a.hour, b.hour) })
	start := time.Now()
	if err := s.commit(files); err != nil {
		s.fail(err)
		return
	}
	took := time.Since(start)
	var rows, bytes int64
	for _, f := range files {
		rows += f.rows
		bytes += f.out.n
		s.writeCalls += f.out.calls
	}
	s.m.commitSeconds.Observe(took.Seconds())
	ends := s.ends.take()
	s.fresh.observe(StageCommitted, time.Now(), ends)
	s.m.files.Add(float64(len(files)))
	s.m.rows.Add(float64(rows))
	s.m.bytes.Add(float64(bytes))
	if rows > 0 {
		s.bpr = float64(bytes) / float64(rows)
	}
	if s.ledger != nil {
		for _, f := range files {
			s.ledger.committedFile(f.hour, filepath.Base(f.final), f.batches)
		}
	}
	clear(s.files)
	s.m.open.Set(0)
	if s.remote != nil {
		if err := s.uploadAll(files); err != nil {
			// Hard stop while S3 is unreachable: the files stay staged
			// (uploaded at the next start), the batches are redelivered
			// and deduplicated against the uploaded objects.
			clear(s.files)
			s.m.open.Set(0)
			if s.ledger != nil {
				s.ledger.dropOpen()
			}
			batches, records := s.acks.Len()
			s.failHeld(err)
			s.log.Warn("stopped before every committed file was uploaded; they stay staged for the next start", "batches", batches, "records", records, "err", err)
			return
		}
		s.fresh.observe(StageUploaded, time.Now(), ends)
	}
	s.commits++
	s.growStep()
	failpointCommitted(s.log, s.crashAt, s.commits) // test builds only: files committed, batches not acked
	batches, _ := s.acks.Len()
	s.acks.Ack(nil)
	s.log.Info("committed parquet files", "reason", reason, "files", len(files), "rows", rows, "bytes", bytes,
		"batches", batches, "commit_seconds", took.Seconds())
	if s.fails.failures > 0 && s.step == 0 { // during small steps failures and successes alternate: one line when they end
		s.log.Info("parquet commits recovered", "failed_attempts", s.fails.failures)
		s.fails = failLog{}
	}
}

// abort closes and removes every open file (temp or, after a partial
// commit, final). It does not ack.
func (s *Sink[T]) abort() {
	for _, f := range s.files {
		if f.f != nil {
			_ = f.f.Close()
		}
		p := f.tmp
		if f.final != "" {
			p = f.final
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Error("cannot remove an uncommitted parquet file; remove it by hand", "path", p, "err", err)
		}
	}
	clear(s.files)
	s.m.open.Set(0)
	s.stopTimer()
	s.ends.reset() // observed when their redelivery commits
	if s.ledger != nil {
		s.ledger.dropOpen()
	}
}

// fail aborts every open file and acks every batch held with err.
func (s *Sink[T]) fail(err error) {
	if isSpaceErr(err) {
		s.shrinkStep(s.openEstimate())
	}
	s.abort()
	batches, records := s.acks.Len()
	s.failHeld(err)
	s.m.commitErrors.Inc()
	s.fails.failures++
	key := err.Error()
	var ce *CommitError
	if errors.As(err, &ce) {
		key = ce.Op + filepath.Dir(ce.Path) + ce.Err.Error()
	}
	now := time.Now()
	if key == s.fails.key && now.Sub(s.fails.at) < time.Minute {
		s.fails.suppressed++
		return
	}
	s.log.Error("parquet write failed; held batches failed for redelivery", "err", err, "batches", batches,
		"records", records, "same_failures_not_logged", s.fails.suppressed)
	s.fails.key, s.fails.at, s.fails.suppressed = key, now, 0
}

// failHeld acks every batch held, and the one being written, with err.
func (s *Sink[T]) failHeld(err error) {
	s.acks.Ack(err)
	if b := s.cur; b != nil {
		s.cur = nil
		b.Ack(err)
	}
}

// removeStale removes the temp files of this writer left by a previous
// run that did not finish (crash, kill -9). Other writers' temp files are
// theirs: '@' cannot appear in a writer name, so the prefix is exact.
func (s *Sink[T]) removeStale() {
	prefix := "." + s.writer + "@"
	removed := 0
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == s.root {
				return nil
			}
			return err
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), prefix) && strings.HasSuffix(d.Name(), ".tmp") {
			if err := os.Remove(p); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	if err != nil {
		s.log.Warn("cleaning stale temp files", "root", s.root, "err", err)
	}
	if removed > 0 {
		s.log.Info("removed stale temp files of an unfinished run", "root", s.root, "files", removed)
	}
}
