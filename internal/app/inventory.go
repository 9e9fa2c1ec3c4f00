package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"

	js "github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/enrich/invserve"
	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/version"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

// confirmHandler serves POST /-/inventory/confirm; confirm reports
// whether the process has an inventory and whether one was held (and is
// now applied).
func confirmHandler(confirm func() (has, held bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		switch has, held := confirm(); {
		case !has:
			http.Error(w, "no inventory in this process", http.StatusNotFound)
		case !held:
			http.Error(w, "no inventory is held back", http.StatusConflict)
		default:
			_, _ = io.WriteString(w, "held inventory applied\n")
		}
	})
}

// RunInventoryServe is `tapflow inventory serve`: it reads the cloud
// through inventory.provider (openstack or file) and publishes snapshots
// to the NATS that nats.url names, until ctx ends.
func RunInventoryServe(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if err := provider.ServiceCheck(cfg.Inventory); err != nil {
		return err
	}
	if cfg.NATS.URL == "" {
		return errors.New("inventory serve publishes to the NATS the agents use: set nats.url")
	}
	return runInventoryServe(ctx, cfg, log, obs.NewRegistry(), obs.NewReadiness())
}

// runInventoryServe is RunInventoryServe with the registry and readiness
// given (tests read them).
func runInventoryServe(ctx context.Context, cfg config.Config, log *slog.Logger, reg *obs.Registry, ready *obs.Readiness) error {
	// SIGHUP from the first line on (Connect waits for as long as NATS is
	// down): like POST /-/refresh, it asks a source that can (openstack)
	// for a pass now; the file source is re-read on change anyway.
	var refresher atomic.Pointer[func()]
	refresh := func() bool {
		if f := refresher.Load(); f != nil {
			(*f)()
			return true
		}
		return false
	}
	defer catchHangups(log, "inventory serve", refresh)()
	outer := ctx
	ready.Add("process", func() error {
		if outer.Err() != nil {
			return errors.New("shutting down")
		}
		return nil
	})
	src, err := provider.Service(cfg.Inventory, provider.Env{Logger: log, Registry: reg})
	if err != nil {
		return err
	}
	if rf, ok := src.(interface{ Refresh() }); ok {
		f := rf.Refresh
		refresher.Store(&f)
	}
	instance := cfg.Inventory.Serve.Instance
	if instance == "" {
		instance = fmt.Sprintf("%s-%d", cfg.Node, os.Getpid())
	}
	nc, err := transport.Connect(ctx, cfg.NATS, "tapflow-inventory-"+cfg.Node, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer nc.Close()
	reg.MustRegister(transport.ConnectedGauge(nc))
	ready.Add("nats", func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected (%s)", natsStatus(nc))
		}
		return nil
	})
	jsc, err := js.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	var views *nodeview.Builder
	if cfg.Inventory.Scope == "node" {
		key, err := nodeview.LoadKey(cfg.Inventory.Serve.KeyFile)
		if err != nil {
			return err
		}
		if views, err = nodeview.New(key); err != nil {
			return err
		}
	}
	svc, err := invserve.New(invserve.Config{
		Views:    views,
		Instance: instance, Lease: cfg.Inventory.Serve.Lease.D(), PollInterval: cfg.Inventory.PollInterval.D(),
		Guard: inventory.DropGuard{MaxDrop: cfg.Inventory.MaxDropFraction, ConfirmReads: cfg.Inventory.DropConfirmReads,
			MinPorts: cfg.Inventory.DropMinPorts},
		Replicas: cfg.NATS.Replicas,
		Lookup: lookup.ServerOptions{Rate: cfg.Inventory.Lookup.Rate, Burst: cfg.Inventory.Lookup.Burst,
			Window: cfg.Inventory.Lookup.Window.D()},
	}, src, jsc, log, reg)
	if err != nil {
		return err
	}
	defer svc.Close()
	if cfg.Metrics.Listen != "" {
		srv, err := obs.Listen(cfg.Metrics.Listen, reg, obs.ServerOptions{Ready: ready, Pprof: cfg.Metrics.Pprof, Extra: map[string]http.Handler{
			"/-/inventory/confirm": confirmHandler(func() (bool, bool) { return true, svc.ConfirmDrop() }),
			"/-/refresh": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost {
					http.Error(w, "use POST", http.StatusMethodNotAllowed)
					return
				}
				refresh()
				_, _ = io.WriteString(w, "inventory refresh requested\n")
			}),
		}})
		if err != nil {
			return err
		}
		log.Info("metrics endpoint", "url", "http://"+srv.Addr()+"/metrics")
		mctx, stop := context.WithCancel(context.Background())
		defer stop()
		go func() {
			if err := srv.Run(mctx); err != nil {
				log.Error("metrics server stopped", "err", err)
			}
		}()
	}
	log.Info("tapflow inventory serve starting", "version", version.Version, "instance", instance, "provider", cfg.Inventory.Provider,
		"lease", cfg.Inventory.Serve.Lease, "nats", natsTarget(cfg))
	return svc.Run(ctx)
}
