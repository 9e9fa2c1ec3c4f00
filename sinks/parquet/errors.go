package parquet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
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
