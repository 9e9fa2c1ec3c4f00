//go:build tapflow_failpoints

package consume

import (
	"log/slog"
	"os"
	"strings"
	"syscall"
)

// failpointDecode SIGKILLs the process when it is about to decode the
// message whose Nats-Msg-Id is named by
// TAPFLOW_FAILPOINT=consume-decode:<msg id> (sinks/parquet.FailpointEnv):
// a stand-in for a message arrow-go dies on (an allocation no recover
// catches), for the poison tests of the real binary. Release builds have
// the no-op of failpoint_off.go.
func failpointDecode(log *slog.Logger, msgID string) {
	id, ok := strings.CutPrefix(os.Getenv("TAPFLOW_FAILPOINT"), "consume-decode:")
	if !ok || id == "" || id != msgID {
		return
	}
	log.Warn("failpoint: killing the process while decoding a message", "msg_id", msgID)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns: the signal ends the process
}
