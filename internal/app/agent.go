package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/tapflow/tapflow/bpf"
	ebpfsrc "github.com/tapflow/tapflow/bpf/source"
	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// agent is source → enrich → publish, plus the inventory reload loop.
type agent struct {
	source pipeline.Source
	engine *enrich.Engine
	sink   pipeline.Sink
	runner *pipeline.Runner
	// meters publishes the capture's meter.v1 deltas (source ebpf only).
	meters *pipeline.RunnerOf[schemas.Meter]
	rt     *runtime
	asker  *lookup.Asker // provider nats: targeted lookups; else nil
}

func newAgent(cfg config.Config, rt *runtime) (*agent, error) {
	log := rt.log.With("process", "agent")
	var (
		src    pipeline.Source
		opts   []enrich.Option
		meters *pipeline.RunnerOf[schemas.Meter]
		// synth is the synthetic source's own cloud (provider.Agent
		// attributes with it unless inventory.file or provider nats).
		synth provider.Provider
	)
	switch cfg.Source {
	case "synthetic":
		s, err := synthetic.New(cfg.Synthetic, synthetic.Options{Node: cfg.Node, Logger: log, Registry: rt.reg, RecycleArrays: true})
		if err != nil {
			return nil, fmt.Errorf("synthetic source: %w", err)
		}
		src = s
		synth = synthetic.NewStaticProvider(s.Inventory())
	case "ebpf":
		// Say exactly which privilege or kernel feature is missing before
		// anything else starts.
		if err := bpf.CheckKernel(); err != nil {
			return nil, fmt.Errorf("source ebpf: %w", err)
		}
		feed, err := ebpfsrc.NewMeterFeed(ebpfsrc.MeterFeedOptions{Node: cfg.Node, Logger: log, Registry: rt.reg})
		if err != nil {
			return nil, err
		}
		s, err := ebpfsrc.New(cfg.Capture, ebpfsrc.Options{Node: cfg.Node, Logger: log, Registry: rt.reg, Meters: feed.Add})
		if err != nil {
			return nil, fmt.Errorf("ebpf source: %w", err)
		}
		src = s
		if d := cfg.Attribution.SwapBarrier.D(); d > 0 {
			// Live flows are attributed with the inventory they flowed
			// under before a change is swapped in (enrich/barrier.go).
			opts = append(opts, enrich.WithExporter(s, d))
		}
		rt.addReady("capture", func() error {
			if !s.Running() {
				return errors.New("eBPF programs not loaded and attached yet")
			}
			return nil
		})
		// Ready either way (nothing is lost), but an operator reading
		// /readyz learns that restarts leave a gap (capture.PinNote).
		rt.addNote("capture", s.PinNote)
		if meters, err = newAgentMeters(cfg, rt, feed, log); err != nil {
			return nil, fmt.Errorf("meter pipeline: %w", err)
		}
	}
	// The provider (and, for nats, the targeted lookups): provider.Agent.
	chosen, err := provider.Agent(cfg.Inventory, provider.Env{Logger: log, Registry: rt.reg, NC: rt.nc, Node: cfg.Node,
		StatePath: cfg.InventoryStatePath(), Synthetic: synth})
	if err != nil {
		return nil, err
	}
	opts = append(opts, enrich.WithProvider(chosen.Provider))
	if chosen.Asker != nil {
		opts = append(opts, enrich.WithUnknownVM(chosen.Asker.Ask))
	}
	eng, err := enrich.New(cfg.EnrichConfig(), log, rt.reg, opts...)
	if err != nil {
		return nil, fmt.Errorf("enrich: %w", err)
	}
	rt.addReady("inventory", func() error {
		if eng.Snapshot().Version() == 0 {
			return errors.New("not loaded yet (records would go unattributed)")
		}
		return nil
	})
	var sp *spool.Spool
	if cfg.Agent.Spool.Enabled() {
		if sp, err = spool.New(cfg.Agent.Spool, spool.Options{Logger: log, Registry: rt.reg}); err != nil {
			return nil, err
		}
	}
	pub, err := publish.New(rt.js, publish.Options{
		AgentID: cfg.Agent.ID, Node: cfg.Node, StateDir: cfg.AgentStateDir(),
		NATS: cfg.NATS, Logger: log, Registry: rt.reg, Spool: sp,
	})
	if err != nil {
		return nil, err
	}
	runner, err := pipeline.NewRunner(pipeline.Config{
		Name: "agent", EdgeCapacity: cfg.Agent.EdgeCapacity, ShutdownTimeout: cfg.Agent.ShutdownTimeout.D(),
	}, src, []pipeline.Transform{eng}, pub, rt.pm, log)
	if err != nil {
		return nil, err
	}
	refresh := eng.Refresh
	rt.refresh.Store(&refresh)
	confirm := eng.ConfirmDrop
	rt.confirmDrop.Store(&confirm)
	return &agent{source: src, engine: eng, sink: pub, runner: runner, meters: meters, rt: rt, asker: chosen.Asker}, nil
}

// Run loads the inventory before the source starts (capture must not run
// unattributed), keeps it fresh, and runs the pipeline (and the meter
// pipeline, which outlives it to publish the capture's last meters).
func (a *agent) Run(ctx context.Context) error {
	defer a.engine.Close()
	if err := a.engine.Load(ctx); err != nil {
		return fmt.Errorf("load inventory: %w", err)
	}
	reloadCtx, stopReload := context.WithCancel(context.Background())
	defer stopReload()
	go func() {
		if err := a.engine.Run(reloadCtx); err != nil {
			a.rt.log.Error("inventory reload loop stopped", "err", err)
		}
	}()
	if a.asker != nil {
		go func() { _ = a.asker.Run(reloadCtx) }()
	}
	return runWithMeters(ctx, a.runner, a.meters)
}
