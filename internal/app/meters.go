package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"golang.org/x/sync/errgroup"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/publish"
)

// newAgentMeters builds the agent's meter pipeline: feed (the capture's
// meter deltas) → publish on tapflow.meters.v1.<node>.
func newAgentMeters(cfg config.Config, rt *runtime, feed pipeline.SourceOf[schemas.Meter], log *slog.Logger) (*pipeline.RunnerOf[schemas.Meter], error) {
	pub, err := publish.NewMeters(rt.js, publish.MeterOptions{
		AgentID: cfg.Agent.ID, Node: cfg.Node, StateDir: cfg.AgentStateDir(),
		NATS: cfg.NATS, Logger: log, Registry: rt.reg,
	})
	if err != nil {
		return nil, err
	}
	return pipeline.NewRunnerOf(pipeline.Config{
		Name: "agent-meters", EdgeCapacity: cfg.Agent.EdgeCapacity, ShutdownTimeout: cfg.Agent.ShutdownTimeout.D(),
	}, feed, nil, pipeline.SinkOf[schemas.Meter](pub), rt.pm, log)
}

// runWithMeters runs the flow pipeline with ctx and the meter pipeline
// (when there is one) until the flow pipeline has returned — the capture
// hands over its last meter deltas while it shuts down — then stops the
// meter pipeline gracefully. A failing meter pipeline stops the agent.
func runWithMeters(ctx context.Context, flows *pipeline.Runner, meters *pipeline.RunnerOf[schemas.Meter]) error {
	if meters == nil {
		return flows.Run(ctx)
	}
	fctx, stopFlows := context.WithCancel(ctx)
	defer stopFlows()
	mctx, stopMeters := context.WithCancel(context.Background())
	defer stopMeters()
	mdone := make(chan error, 1)
	go func() {
		err := meters.Run(mctx)
		if err != nil {
			stopFlows()
		}
		mdone <- err
	}()
	ferr := flows.Run(fctx)
	stopMeters()
	merr := <-mdone
	if merr != nil {
		merr = fmt.Errorf("meter pipeline: %w", merr)
	}
	return errors.Join(ferr, merr)
}

// collector is consume → Parquet for flows and for meters, and the
// stream backlog gauges.
type collector struct {
	flows   *pipeline.RunnerOf[schemas.Row]
	meters  *pipeline.RunnerOf[schemas.Row]
	backlog *transport.BacklogMonitor
}

// Run runs both pipelines until ctx ends; one failing stops the other.
func (c *collector) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.backlog.Run(gctx) })
	g.Go(func() error { return c.flows.Run(gctx) })
	g.Go(func() error {
		if err := c.meters.Run(gctx); err != nil {
			return fmt.Errorf("meter pipeline: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// newCollectorMeters builds consume TAPFLOW_METERS → Parquet <output>/meters.
func newCollectorMeters(cfg config.Config, rt *runtime, drain bool, log *slog.Logger) (*pipeline.RunnerOf[schemas.Row], error) {
	src, err := consume.NewMeterRows(rt.js, cfg.Collector.Consumer, consume.Options{
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
	sink, err := parquet.NewFor(cfg.Collector.Parquet, parquet.MeterRowSchema, parquet.Options{Node: cfg.Node, Logger: log, Registry: rt.reg, Dedupe: true, Remote: remote,
		LedgerRefresh: ledgerRefresh(cfg), CommitDue: src.CommitDue})
	if err != nil {
		return nil, fmt.Errorf("parquet meter sink: %w", err)
	}
	return pipeline.NewRunnerOf(pipeline.Config{
		Name: "collector-meters", EdgeCapacity: collectorEdgeCapacity, ShutdownTimeout: 2 * cfg.Agent.ShutdownTimeout.D(),
	}, pipeline.SourceOf[schemas.Row](src), nil, pipeline.SinkOf[schemas.Row](sink), rt.pm, log)
}
