package app

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// collectorRuntimeBytes is the collector's memory besides its open files
// and in-flight messages: Go runtime, NATS client, ledgers, metrics.
const collectorRuntimeBytes = 64 << 20

// collectorMemoryLimit is the Go soft memory limit of a collector
// process: what its settings let it hold at most. Both sinks (flows,
// meters) may fill their open files (Config.MemoryEstimate each, the
// same settings); per stream up to collectorEdgeCapacity+2 decoded
// messages are in flight (the edge queue, the one being decoded and the
// one being written), each at most max_message_bytes, and one pull of
// fetch_batch messages waits in the NATS client, each at most the
// server's max_payload (transport.MaxPayload); each stream's decode pool
// keeps up to consume.DefaultDecodePoolBytes of idle buffers for the next
// messages. At the defaults:
// 2 × 256 MiB + 4 × 64 MiB + 64 × 8 MiB + 2 × 32 MiB + 64 MiB = 1408 MiB.
func collectorMemoryLimit(cfg config.Config) int64 {
	inflight := int64(collectorEdgeCapacity+2) * int64(cfg.Collector.Consumer.MaxMessageBytes)
	fetched := int64(cfg.Collector.Consumer.FetchBatch) * transport.MaxPayload
	pools := int64(2 * consume.DefaultDecodePoolBytes)
	return 2*cfg.Collector.Parquet.MemoryEstimate() + inflight + fetched + pools + collectorRuntimeBytes
}

// setCollectorMemoryLimit gives a collector process a soft memory limit
// (debug.SetMemoryLimit) from its settings, unless GOMEMLIMIT sets one:
// below it the garbage collector runs as GOGC says (the heap may grow to
// twice the live heap); near it the collector collects more often
// instead of growing, so a burst of large messages costs CPU, not the
// host's memory. It returns the limit in force.
func setCollectorMemoryLimit(cfg config.Config, log *slog.Logger) int64 {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		limit := debug.SetMemoryLimit(-1)
		log.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", env, "limit", units.ByteSize(limit).String())
		return limit
	}
	limit := collectorMemoryLimit(cfg)
	debug.SetMemoryLimit(limit)
	log.Info("soft memory limit set from the collector's settings (override with GOMEMLIMIT)", "limit", units.ByteSize(limit).String())
	return limit
}
