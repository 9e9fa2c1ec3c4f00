// Package app wires tapflow's components into the three processes the CLI
// runs: the agent (source → enrich → publish), the collector (consume →
// Parquet) and run (both, around an embedded NATS server), with the
// metrics endpoint and an ordered graceful shutdown.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/version"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/transport"
)

// RunAll runs agent + collector (+ embedded NATS unless nats.url is set)
// until ctx ends, then stops in order: agent (publishes what it holds),
// collector (drains the stream, commits, acks), NATS.
func RunAll(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	return withRuntime(ctx, cfg, log, "run", waitForNATS, func(ctx context.Context, rt *runtime) error {
		return runAll(ctx, cfg, rt)
	})
}

// runAll is RunAll inside a runtime (tests bring their own).
func runAll(ctx context.Context, cfg config.Config, rt *runtime) error {
	agent, err := newAgent(cfg, rt)
	if err != nil {
		return err
	}
	collector, err := newCollector(cfg, rt, true)
	if err != nil {
		return err
	}
	rt.start()
	// The collector outlives the agent: it stops only once the agent has
	// published everything, then drains what is left.
	collCtx, stopCollector := context.WithCancel(context.Background())
	defer stopCollector()
	g := new(errgroup.Group)
	g.Go(func() error {
		err := collector.Run(collCtx)
		if err != nil {
			return fmt.Errorf("collector: %w", err)
		}
		return nil
	})
	agentErr := agent.Run(ctx)
	if agentErr != nil {
		agentErr = fmt.Errorf("agent: %w", agentErr)
	}
	rt.log.Info("agent stopped; collector draining the streams")
	stopCollector()
	return errors.Join(agentErr, g.Wait())
}

// RunAgent runs the agent alone. It does not wait for an external NATS:
// capture starts at once and batches go to the spool until NATS answers.
func RunAgent(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	return withRuntime(ctx, cfg, log, "agent", natsInBackground, func(ctx context.Context, rt *runtime) error {
		a, err := newAgent(cfg, rt)
		if err != nil {
			return err
		}
		rt.start()
		return a.Run(ctx)
	})
}

// RunCollector runs the collector alone.
func RunCollector(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	return withRuntime(ctx, cfg, log, "collector", waitForNATS, func(ctx context.Context, rt *runtime) error {
		// Only a collector alone: `run` shares its process with an
		// agent and NATS, whose memory this limit does not count.
		setCollectorMemoryLimit(cfg, rt.log)
		c, err := newCollector(cfg, rt, false)
		if err != nil {
			return err
		}
		rt.start()
		return c.Run(ctx)
	})
}

// runtime is what every process shares: logger, metrics, NATS.
type runtime struct {
	command string // run, agent or collector (log lines)
	log     *slog.Logger
	reg     *obs.Registry
	// ready answers /readyz; components add their checks as they are
	// built and start() opens the gate once all of them are.
	ready   *obs.Readiness
	started atomic.Bool
	nc      *nats.Conn
	js      js.JetStream
	pm      *pipeline.Metrics // one set for every pipeline of the process

	// refresh asks the inventory provider for an immediate reconcile
	// (SIGHUP, POST /-/refresh); set once an agent exists.
	refresh atomic.Pointer[func()]
	// confirmDrop applies an inventory the drop guard holds back
	// (POST /-/inventory/confirm); set once an agent exists.
	confirmDrop atomic.Pointer[func() bool]
}

// start marks the process built: /readyz now reports its checks.
func (rt *runtime) start() { rt.started.Store(true) }

// addReady adds a readiness check (no-op for runtimes without /readyz).
func (rt *runtime) addReady(name string, fn func() error) {
	if rt.ready != nil {
		rt.ready.Add(name, fn)
	}
}

// addNote adds a readiness note: shown by /readyz, never making it fail.
func (rt *runtime) addNote(name string, fn func() string) {
	if rt.ready != nil {
		rt.ready.Note(name, fn)
	}
}

func (rt *runtime) requestRefresh() bool {
	if f := rt.refresh.Load(); f != nil {
		(*f)()
		return true
	}
	return false
}

// natsMode says how a process meets an external NATS that does not answer.
type natsMode int

const (
	// waitForNATS: connect (retrying) and create the streams before the
	// body runs (the collector: nothing to do without NATS).
	waitForNATS natsMode = iota
	// natsInBackground: the body starts at once; the connection and the
	// streams come up in the background (the agent: capture from the
	// first second, batches spooled meanwhile).
	natsInBackground
)

func withRuntime(ctx context.Context, cfg config.Config, log *slog.Logger, command string, mode natsMode, body func(context.Context, *runtime) error) error {
	rt := &runtime{command: command, log: log, reg: obs.NewRegistry(), ready: obs.NewReadiness()}
	return runtimeBody(ctx, cfg, rt, mode, body)
}

// runtimeBody is withRuntime with the runtime given (tests keep a handle
// on its registry and readiness).
func runtimeBody(ctx context.Context, cfg config.Config, rt *runtime, mode natsMode, body func(context.Context, *runtime) error) error {
	log := rt.log
	// SIGHUP from the first line on: the collector may wait here for NATS
	// and its streams for as long as they are down.
	defer catchHangups(log, rt.command, rt.requestRefresh)()
	rt.pm = pipeline.NewMetrics(rt.reg)
	var err error
	if cfg.NATS.Metrics, err = transport.NewConnMetrics(rt.reg); err != nil {
		return err
	}
	// Not ready until built, and no longer once the stop begins (before
	// the agent flushes and the collector drains): a load balancer or
	// orchestrator stops sending work first.
	outer := ctx
	rt.ready.Add("process", func() error {
		switch {
		case outer.Err() != nil:
			return errors.New("shutting down")
		case !rt.started.Load():
			return errors.New("starting")
		}
		return nil
	})
	log.Info("tapflow starting", "version", version.Version, "node", cfg.Node, "source", cfg.Source,
		"data_dir", cfg.DataDir, "nats", natsTarget(cfg), "output", cfg.Collector.Parquet.Output)

	metricsCtx, stopMetrics := context.WithCancel(context.Background())
	defer stopMetrics()
	if cfg.Metrics.Listen != "" {
		srv, err := obs.Listen(cfg.Metrics.Listen, rt.reg, obs.ServerOptions{Ready: rt.ready, Pprof: cfg.Metrics.Pprof, Extra: map[string]http.Handler{
			"/-/refresh": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost {
					http.Error(w, "use POST", http.StatusMethodNotAllowed)
					return
				}
				if !rt.requestRefresh() {
					http.Error(w, "no inventory in this process", http.StatusNotFound)
					return
				}
				_, _ = io.WriteString(w, "inventory refresh requested\n")
			}),
			"/-/inventory/confirm": confirmHandler(func() (bool, bool) {
				f := rt.confirmDrop.Load()
				if f == nil {
					return false, false
				}
				return true, (*f)()
			}),
		}})
		if err != nil {
			return err
		}
		log.Info("metrics endpoint", "url", "http://"+srv.Addr()+"/metrics")
		go func() {
			if err := srv.Run(metricsCtx); err != nil {
				log.Error("metrics server stopped", "err", err)
			}
		}()
	}

	// fatal stops the body when the background NATS setup fails for good
	// (credentials refused, a stream configuration the server rejects).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fatalErr atomic.Pointer[error]
	fatal := func(err error) {
		if fatalErr.CompareAndSwap(nil, &err) {
			log.Error("NATS setup failed; stopping", "err", err)
			cancel()
		}
	}

	background := false
	if cfg.NATS.URL == "" {
		// Embedded server: `run` always, agent/collector alone too (single box).
		emb, eerr := transport.NewEmbeddedServer(transport.StoreDir(cfg.DataDir), "tapflow-"+cfg.Node, cfg.NATS, log)
		if eerr != nil {
			return eerr
		}
		if err := emb.Start(); err != nil {
			return err
		}
		defer func() {
			_ = emb.Close()
			log.Info("embedded nats-server stopped")
		}()
		rt.nc, err = emb.Connect("tapflow-"+cfg.Node, log)
	} else if mode == natsInBackground {
		background = true
		rt.nc, err = transport.ConnectBackground(cfg.NATS, "tapflow-"+cfg.Node, log, fatal)
	} else {
		rt.nc, err = transport.Connect(ctx, cfg.NATS, "tapflow-"+cfg.Node, log)
	}
	if err != nil {
		if ctx.Err() != nil {
			log.Info("stopped while waiting for NATS", "err", err)
			return nil
		}
		return err
	}
	defer func() {
		// Flush outstanding acks before the connection goes.
		if rt.nc.IsConnected() {
			_ = rt.nc.FlushTimeout(5 * time.Second)
		}
		rt.nc.Close()
	}()
	if rt.js, err = js.New(rt.nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	nc := rt.nc
	rt.reg.MustRegister(transport.ConnectedGauge(nc))
	var streamsReady atomic.Bool
	rt.ready.Add("nats", func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected (%s)", natsStatus(nc))
		}
		if !streamsReady.Load() {
			return errors.New("JetStream streams not created yet")
		}
		return nil
	})
	if background {
		// The publisher spools until NATS answers; the streams are
		// created (or checked) once it does.
		go func() {
			if !waitConnected(ctx, rt.nc) {
				return
			}
			// Only agents start in the background: they keep the
			// collectors' consumer settings.
			if err := transport.EnsureStreamsKeepConsumers(ctx, rt.js, cfg.NATS, log); err != nil {
				if ctx.Err() == nil {
					fatal(err)
				}
				return
			}
			streamsReady.Store(true)
		}()
	} else if err := transport.EnsureStreams(ctx, rt.js, cfg.NATS, log); err != nil {
		if ctx.Err() != nil {
			// Stopped while the streams were being created: nothing ran,
			// nothing is lost; a requested stop is not a failure.
			log.Info("stopped before the JetStream streams were ready", "err", err)
			return nil
		}
		return err
	} else {
		streamsReady.Store(true)
	}
	err = body(ctx, rt)
	if f := fatalErr.Load(); f != nil {
		return errors.Join(*f, err)
	}
	return err
}

// waitConnected reports once nc is connected; false when ctx ends or the
// connection closed first.
func waitConnected(ctx context.Context, nc *nats.Conn) bool {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// natsStatus names the connection state for /readyz.
func natsStatus(nc *nats.Conn) string {
	switch nc.Status() {
	case nats.RECONNECTING:
		return "reconnecting"
	case nats.CLOSED:
		return "closed"
	case nats.CONNECTING:
		return "connecting"
	default:
		return nc.Status().String()
	}
}

func natsTarget(cfg config.Config) string {
	if cfg.NATS.URL == "" {
		return "embedded"
	}
	return "external"
}
