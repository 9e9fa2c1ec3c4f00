//go:build !tapflow_failpoints

package consume

import "log/slog"

// failpointDecode: release builds have no failpoint (failpoint_on.go).
func failpointDecode(*slog.Logger, string) {}
