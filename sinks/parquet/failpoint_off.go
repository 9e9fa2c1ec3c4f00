//go:build !tapflow_failpoints

package parquet

import "log/slog"

// failpointsTagged: a release build, without the failpoint.
const failpointsTagged = false

// failpointAfterCommit: release builds have no failpoint; FailpointEnv is
// not read.
func failpointAfterCommit() int { return 0 }

func failpointCommitted(*slog.Logger, int, int) {}
