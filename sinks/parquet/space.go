package parquet

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// Recovery from a full disk in small steps.
//
// A failed roll fails every batch it held, and the source redelivers them
// all together once the disk has room again. Written into one set of
// files, that backlog needs as much free space as all of it: on a disk
// with less room than the backlog every retry filled it back to the last
// byte, removed the temp file and failed again, and no row was committed
// until more space than the whole backlog had been freed. So after a
// commit fails for lack of space (ENOSPC, EDQUOT), the sink commits as
// soon as its open files reach a byte budget: the smaller of the step
// (half of what failed, halved on every further failure, doubled on every
// success) and half of the free space measured before each batch. Each
// commit acks only the batches its files hold, as every roll does, so
// the backlog drains file by file with whatever room there is. The step
// ends once it has grown back to RollSize.

// minStep is the smallest step; the free-space half can still make the
// budget smaller, down to one batch per file.
const minStep = 64 << 10

// isSpaceErr reports whether err means the disk or the quota is full.
func isSpaceErr(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// openEstimate is the size the open files would have if committed now.
func (s *Sink[T]) openEstimate() int64 {
	var n int64
	for _, f := range s.files {
		n += f.estimate(s.bpr)
	}
	return n
}

// shrinkStep starts (or narrows) small-step commits after a commit of
// failed bytes failed for lack of space.
func (s *Sink[T]) shrinkStep(failed int64) {
	prev := s.step
	if s.step == 0 || failed < s.step {
		s.step = failed
	}
	s.step = max(s.step/2, minStep)
	if prev == 0 {
		s.log.Warn("output full: committing in small steps until commits succeed again", "step_bytes", s.step, "free_bytes", s.freeBytes())
	}
}

// growStep doubles the step after a successful commit, and ends small
// steps once the step reaches RollSize.
func (s *Sink[T]) growStep() {
	if s.step == 0 {
		return
	}
	s.step *= 2
	if s.step >= int64(s.cfg.RollSize) {
		s.step = 0
		s.log.Info("commits back to roll_size after a full disk", "roll_size", s.cfg.RollSize.String())
	}
}

// stepBudget is how many bytes the open files may hold during small
// steps: the step, and at most half the free space.
func (s *Sink[T]) stepBudget() int64 {
	budget := s.step
	if free := s.freeBytes(); free >= 0 {
		budget = min(budget, free/2)
	}
	return budget
}

// freeBytes is the space available to the collector's user on the
// filesystem of the sink's root (its nearest existing ancestor), or -1
// when it cannot be measured.
func (s *Sink[T]) freeBytes() int64 {
	for dir := s.root; ; dir = filepath.Dir(dir) {
		var st syscall.Statfs_t
		err := syscall.Statfs(dir, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize)
		}
		if !errors.Is(err, os.ErrNotExist) || filepath.Dir(dir) == dir {
			return -1
		}
	}
}
