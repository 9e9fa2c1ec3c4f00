package app

import (
	"fmt"
	"path/filepath"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// consumeStateDir holds the consumers' poison markers
// (transport/consume/poison.go).
func consumeStateDir(cfg config.Config) string { return filepath.Join(cfg.DataDir, "consume") }

// newCollector builds consume → Parquet for flows and for meters. drain
// makes a graceful stop consume everything left in the streams first
// (tapflow run).
func newCollector(cfg config.Config, rt *runtime, drain bool) (*collector, error) {
	log := rt.log.With("process", "collector")
	src, err := consume.NewRows(rt.js, cfg.Collector.Consumer, consume.Options{
		Drain: drain, DrainTimeout: cfg.Agent.ShutdownTimeout.D(), Logger: log, Registry: rt.reg,
		StateDir: consumeStateDir(cfg),
	})
	if err != nil {
		return nil, err
	}
	remote, err := remoteOutput(cfg, rt)
	if err != nil {
		return nil, err
	}
	sink, err := parquet.NewFor(cfg.Collector.Parquet, parquet.FlowRowSchema, parquet.Options{Node: cfg.Node, Logger: log, Registry: rt.reg, Dedupe: true, Remote: remote,
		LedgerRefresh: ledgerRefresh(cfg), CommitDue: src.CommitDue})
	if err != nil {
		return nil, fmt.Errorf("parquet sink: %w", err)
	}
	flows, err := pipeline.NewRunnerOf(pipeline.Config{
		Name: "collector", EdgeCapacity: collectorEdgeCapacity, ShutdownTimeout: 2 * cfg.Agent.ShutdownTimeout.D(),
	}, src, nil, sink, rt.pm, log)
	if err != nil {
		return nil, err
	}
	meters, err := newCollectorMeters(cfg, rt, drain, log)
	if err != nil {
		return nil, err
	}
	backlog, err := transport.NewBacklogMonitor(rt.js, cfg.NATS, transport.BacklogOptions{Logger: log, Registry: rt.reg})
	if err != nil {
		return nil, err
	}
	return &collector{flows: flows, meters: meters, backlog: backlog}, nil
}

// collectorEdgeCapacity is how many decoded batches wait between the
// consumer and the Parquet sink. Each is a whole agent batch (~9 MiB of
// records at 16,384 per message); the sink is the bottleneck, so a longer
// queue only adds memory (BenchmarkCollectorRSS: 0.9 GiB peak at 16, 447
// MiB at 2, same records per CPU-second), while the fetch keeps up.
const collectorEdgeCapacity = 2
