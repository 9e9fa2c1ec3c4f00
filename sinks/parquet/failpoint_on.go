//go:build tapflow_failpoints

package parquet

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// failpointsTagged: this build has the failpoint.
const failpointsTagged = true

// failpointAfterCommit reads FailpointEnv: N of parquet-after-commit:N,
// else 0 (off).
func failpointAfterCommit() int {
	v, ok := strings.CutPrefix(os.Getenv(FailpointEnv), "parquet-after-commit:")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// failpointCommitted SIGKILLs the process once commits reaches crashAt
// (> 0): files committed, batches not acked.
func failpointCommitted(log *slog.Logger, crashAt, commits int) {
	if crashAt <= 0 || commits < crashAt {
		return
	}
	log.Warn("failpoint: killing the process after a commit, before its acks", "failpoint", FailpointEnv, "commits", commits)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns: the signal ends the process
}
