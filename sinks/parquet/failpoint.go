package parquet

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// FailpointEnv names the environment variable of the sink's one fault
// injection point, for crash tests of the real binary:
// TAPFLOW_FAILPOINT=parquet-after-commit:N makes the process SIGKILL itself
// right after its N-th commit (files renamed and fsynced), before any of
// the commit's batches is acked — the instant a redelivery of committed
// data is certain. Unset in production.
const FailpointEnv = "TAPFLOW_FAILPOINT"

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

func crashNow() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns: the signal ends the process
}
