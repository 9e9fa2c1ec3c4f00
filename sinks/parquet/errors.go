package parquet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// CommitError is how the sink fails the batches it could not make durable:
// the operation, the file or directory it failed on, the cause (usually a
// syscall.Errno such as ENOSPC) and what to do about it. Every batch held
// for the failed files is acked with it; the source leaves their messages
// unacked for redelivery.
type CommitError struct {
	Op   string // create, write, fsync, close, rename, mkdir, fsync dir
	Path string // the file or directory
	Err  error  // the cause
}

func (e *CommitError) Error() string {
	return fmt.Sprintf("%s %s: %v; %s; messages stay unacked and will be redelivered", e.Op, e.Path, e.Err, fixFor(e.Err))
}

func (e *CommitError) Unwrap() error { return e.Err }

// commitError builds a CommitError for op on path, keeping only the cause
// of a *fs.PathError or *os.LinkError (their text would repeat the path).
func commitError(op, path string, err error) *CommitError {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	return &CommitError{Op: op, Path: path, Err: err}
}

// fixFor says what an operator can do about err.
func fixFor(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return "free space or point collector.output elsewhere"
	case errors.Is(err, syscall.EDQUOT):
		return "raise the disk quota or point collector.output elsewhere"
	case errors.Is(err, syscall.EROFS):
		return "the filesystem is read-only: remount it read-write or point collector.output elsewhere"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return "make the directory writable by the collector's user or point collector.output elsewhere"
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EEXIST):
		return "a component of the path is not a directory: move it away or point collector.output elsewhere"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "raise the open-file limit (LimitNOFILE) or lower collector.max_open_files"
	}
	return "check the disk and the permissions of collector.output"
}

// ErrTimeOutOfRange is wrapped by a *RangeError.
var ErrTimeOutOfRange = errors.New("time_end outside the partitions the sink creates")

// RangeError refuses a batch with a record whose time_end lies outside
// [MinTimeEnd, MaxTimeEnd): no record of the batch is written and no
// partition created. Redelivery cannot fix it; the collector's source
// dead-letters such messages by its max_record_age / max_clock_skew checks
// before they reach the sink.
type RangeError struct {
	Seq     int64 // Batch.Seq
	Index   int   // the first record out of range
	TimeEnd int64 // its time_end, µs since the epoch
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("batch seq %d: record %d: %v: time_end %d µs (%s) is outside [%s, %s); the batch is not written; fix the clock of the agent that sent it, then replay the message",
		e.Seq, e.Index, ErrTimeOutOfRange, e.TimeEnd, fmtMicros(e.TimeEnd), MinTimeEnd.Format(time.DateOnly), MaxTimeEnd.Format(time.DateOnly))
}

func (e *RangeError) Unwrap() error { return ErrTimeOutOfRange }

// fmtMicros renders µs since the epoch as RFC 3339 (UTC), for any int64.
func fmtMicros(us int64) string {
	return time.Unix(us/1e6, us%1e6*1e3).UTC().Format(time.RFC3339Nano)
}
