package enrich

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// Provider yields inventories. Poll returns changed=false (and a nil
// inventory) when nothing changed since the last call, and an error when the
// inventory cannot be read; the Engine then keeps its last good snapshot.
type Provider interface {
	Poll(ctx context.Context) (inv *inventory.Inventory, changed bool, err error)
}

// Optional Provider methods the Engine uses when present (the openstack
// provider has them all).
type (
	// runner keeps the provider's own loop (cold start, reconcile);
	// Engine.Run runs it alongside the poll loop.
	runner interface {
		Run(ctx context.Context) error
	}
	// updater signals a new inventory so Run polls at once.
	updater interface{ Updates() <-chan struct{} }
	// refresher re-reads the source on demand (Engine.Refresh).
	refresher interface{ Refresh() }
	// reader counts complete reads of the source, so that polls between
	// two reads do not confirm a held drop (openstack: one per pass).
	// Without it every successful Poll is a read (file: it re-reads).
	reader interface{ Reads() uint64 }
	// guarded providers apply the drop guard themselves (nats: the
	// service did); the Engine does not hold their inventories again.
	guarded interface{ Guarded() bool }
	// keepsNothing providers hold no copy of what they return (file: it
	// re-reads), so the Engine trims the one it keeps.
	keepsNothing interface{ KeepsNothing() bool }
)

// Engine attributes records against the current snapshot and keeps that
// snapshot current. Apply and Flush may run concurrently with Run.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	prov    Provider
	now     func() time.Time
	snap    atomic.Pointer[snapshot.Snapshot]
	version int64 // last version built; owned by the loader
	loadMu  sync.Mutex
	lastInv *inventory.Inventory
	seen    map[string]bool // anomalies already logged and counted
	lastErr string
	guard   inventory.DropGuard
	reads   uint64 // provider Reads() at the last Load
	// lastBuild is how long the last snapshot took to build.
	lastBuild time.Duration

	lateMu sync.Mutex
	late   heldRing
	nHeld  atomic.Int64
	work   atomic.Pointer[batchWork] // Apply's reusable state, taken while in use

	kick chan struct{} // Refresh -> Run

	onUnknown func(vmMAC string) // WithUnknownVM

	// Swap barrier (WithExporter, barrier.go).
	exporter       Exporter
	barrierTimeout time.Duration
	applied        atomic.Uint64 // batches Apply finished
	appliedSig     chan struct{}
}

type heldRecord struct {
	f       schemas.Flow
	in      snapshot.Input // f as parsed once: a held record is not parsed again per snapshot
	at      time.Time
	version int64        // snapshot version last tried
	zone    schemas.Zone // zone of the last try (miss, or multicast)
}

// Option adjusts an Engine; for tests and alternative providers.
type Option func(*Engine)

// WithProvider replaces the provider the config names.
func WithProvider(p Provider) Option { return func(e *Engine) { e.prov = p } }

// WithUnknownVM calls ask (it must not block) with the VM MAC of every
// record held for an unknown VM: provider nats asks the service for it
// (package lookup), so the port arrives within the late-binding window.
func WithUnknownVM(ask func(vmMAC string)) Option { return func(e *Engine) { e.onUnknown = ask } }

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(e *Engine) { e.now = now } }

// New validates cfg and registers the metrics on reg. It reads nothing
// and starts nothing: until Load or Run loads an inventory the Engine
// attributes against an empty snapshot (version 0, everything unknown).
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Engine, error) {
	e := &Engine{cfg: cfg, log: log, now: time.Now, seen: map[string]bool{}, kick: make(chan struct{}, 1), appliedSig: make(chan struct{}, 1),
		guard: inventory.DropGuard{MaxDrop: cfg.Inventory.MaxDropFraction, ConfirmReads: cfg.Inventory.DropConfirmReads, MinPorts: cfg.Inventory.DropMinPorts}}
	for _, o := range opts {
		o(e)
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if e.prov == nil {
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("enrich config: %w", err)
		}
		// Without the process's NATS connection provider nats fails here:
		// the agent chooses with provider.Agent and passes WithProvider.
		ch, err := provider.Agent(cfg.Inventory, provider.Env{Logger: e.log, Registry: reg})
		if err != nil {
			return nil, fmt.Errorf("enrich: %w", err)
		}
		e.prov = ch.Provider
	}
	e.log = e.log.With("component", "enrich")
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("enrich metrics: %w", err)
	}
	e.m = m
	e.snap.Store(snapshot.Build(nil, snapshot.Options{Version: 0, Now: e.now()}))
	return e, nil
}

// Name implements pipeline.Transform.
func (e *Engine) Name() string { return "enrich" }

// Snapshot is the snapshot in use.
func (e *Engine) Snapshot() *snapshot.Snapshot { return e.snap.Load() }

// Load polls the provider once and swaps in a new snapshot if the
// inventory changed. It returns the provider's error (the last good
// snapshot stays in use). Call it before records flow to avoid a cold
// start in which every record waits in the late-binding buffer.
func (e *Engine) Load(ctx context.Context) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	inv, changed, err := e.prov.Poll(ctx)
	if err != nil {
		e.m.reloads.WithLabelValues("error").Inc()
		if msg := err.Error(); msg != e.lastErr {
			e.lastErr = msg
			e.log.Error("inventory not loaded; keeping the last good snapshot", "version", e.snap.Load().Version(), "err", err)
		}
		return err
	}
	e.lastErr = ""
	if g, ok := e.prov.(guarded); !ok || !g.Guarded() {
		inv = e.guardDrop(inv, changed)
		changed = inv != nil
	}
	if changed {
		e.keep(inv)
		e.rebuild(ctx)
		return nil
	}
	// nothing changed: rebuild only to let expired ghosts go
	if s := e.snap.Load(); e.lastInv != nil && s.Stats().Ghosts > 0 && e.now().Sub(s.Built()) > e.cfg.GhostGrace.D() {
		e.rebuild(ctx)
	}
	return nil
}

// guardDrop passes a successful Poll through the drop guard and returns
// the inventory to apply (nil: none). loadMu held.
func (e *Engine) guardDrop(inv *inventory.Inventory, changed bool) *inventory.Inventory {
	fresh := true // this Poll read the source
	if r, ok := e.prov.(reader); ok {
		n := r.Reads()
		fresh, e.reads = n != e.reads, n
	}
	_, wasHeld := e.guard.Holding()
	var apply *inventory.Inventory
	switch {
	case changed:
		apply = e.guard.Offer(e.lastInv, inv)
	case fresh:
		apply = e.guard.Reread()
	}
	if h, held := e.guard.Holding(); held {
		e.m.invHeld.Set(1)
		if !wasHeld {
			e.m.heldTotal.Inc()
		}
		lvl := slog.LevelDebug
		if !wasHeld {
			lvl = slog.LevelWarn
		}
		e.log.Log(context.Background(), lvl, "inventory held back: it lost too many ports at once; attribution keeps the previous snapshot",
			"ports_before", h.PrevPorts, "ports_now", h.Ports, "drop", fmt.Sprintf("%.1f%%", 100*h.Drop()),
			"max_drop_fraction", e.guard.MaxDrop, "reads", h.Reads, "confirm_after_reads", h.Needed,
			"fix", "if the cloud really shrank, wait for the reads or confirm now: tapflow inventory confirm (POST /-/inventory/confirm)")
		return nil
	}
	e.m.invHeld.Set(0)
	if wasHeld && apply != nil {
		e.m.confirmed.WithLabelValues("reads").Inc()
		e.log.Warn("held inventory confirmed by consecutive reads; applying it", "ports", len(apply.Ports))
	} else if wasHeld {
		e.log.Info("held inventory superseded by one within inventory.max_drop_fraction")
	}
	return apply
}

// ConfirmDrop applies an inventory the drop guard holds back, at once
// (the operator's command). It reports whether one was held.
func (e *Engine) ConfirmDrop() bool {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	inv := e.guard.Confirm()
	if inv == nil {
		return false
	}
	e.m.invHeld.Set(0)
	e.m.confirmed.WithLabelValues("operator").Inc()
	e.log.Warn("held inventory confirmed by the operator; applying it", "ports", len(inv.Ports))
	e.keep(inv)
	e.rebuild(context.Background())
	return true
}

// keep makes inv the inventory later rebuilds (ghost expiry) start from:
// only what the snapshot builder reads. The file provider keeps nothing
// itself, so there the floating IPs are trimmed too (see snapshot.Inputs).
func (e *Engine) keep(inv *inventory.Inventory) {
	k, ok := e.prov.(keepsNothing)
	e.lastInv = snapshot.Inputs(inv, ok && k.KeepsNothing())
}

// rebuild builds a snapshot from lastInv and swaps it in. loadMu held.
// ctx ends a swap barrier early (the reload loop stopping).
func (e *Engine) rebuild(ctx context.Context) {
	start, took := e.now(), time.Now()
	prev := e.snap.Load()
	e.version++
	s := snapshot.Build(e.lastInv, snapshot.Options{Version: e.version, Now: start, GhostGrace: e.cfg.GhostGrace.D(), MaxRouteHops: e.cfg.MaxRouteHops, Prev: prev})
	built := time.Since(took)
	e.lastBuild = built
	if e.exporter != nil {
		// Records of traffic before the swap are attributed against prev.
		e.barrier(ctx, s.Changed(prev, start.UnixMicro()), s.Version())
	}
	e.snap.Store(s)
	st := s.Stats()
	e.m.reloads.WithLabelValues("ok").Inc()
	e.m.version.Set(float64(s.Version()))
	e.m.builtAt.Set(float64(s.Built().UnixNano()) / 1e9)
	e.m.endpoints.Set(float64(st.Endpoints))
	e.m.ghosts.Set(float64(st.Ghosts))
	e.m.amphoraMACs.Set(float64(st.AmphoraMACs))
	e.m.routerMACs.Set(float64(st.RouterMACs))
	e.m.buildSeconds.Set(built.Seconds())
	e.m.snapAnomalies.Reset()
	for _, a := range s.Anomalies() {
		e.m.snapAnomalies.WithLabelValues(a.Class).Inc()
		key := a.Class + "\x00" + a.Kind + "\x00" + a.ID
		if !e.seen[key] {
			e.seen[key] = true
			e.m.anomalies.WithLabelValues(a.Class).Inc()
			e.log.Warn("inventory anomaly", "class", a.Class, "kind", a.Kind, "id", a.ID, "detail", a.Detail)
		}
	}
	e.log.Info("attribution snapshot swapped", "version", s.Version(), "endpoints", st.Endpoints, "ghosts", st.Ghosts,
		"amphora_macs", st.AmphoraMACs, "router_macs", st.RouterMACs, "tenants", st.Tenants, "anomalies", len(s.Anomalies()),
		"build", built.Round(time.Microsecond), "swap", time.Since(took).Round(time.Microsecond))
}

// Run loads the inventory at once and then every poll interval, on each
// Refresh and whenever the provider signals a new inventory, until ctx is
// done. A provider with its own loop (openstack: cold start, reconcile
// every inventory.refresh) has it run alongside. Load errors are logged
// and counted, never returned: attribution keeps the last good snapshot.
// Returns nil when ctx is done.
func (e *Engine) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if r, ok := e.prov.(runner); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(ctx); err != nil {
				e.log.Error("inventory provider loop stopped", "err", err)
			}
		}()
	}
	var updates <-chan struct{}
	if u, ok := e.prov.(updater); ok {
		updates = u.Updates()
	}
	t := time.NewTicker(e.cfg.Inventory.PollInterval.D())
	defer t.Stop()
	for {
		if err := e.Load(ctx); err != nil && errors.Is(err, context.Canceled) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-updates:
		case <-e.kick:
		}
	}
}

// Refresh re-reads the inventory source now (SIGHUP, the HTTP refresh
// endpoint): provider openstack starts a reconcile pass, provider file is
// re-read. It does not wait; Run applies the result.
func (e *Engine) Refresh() {
	if r, ok := e.prov.(refresher); ok {
		r.Refresh()
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Close closes the provider when it holds resources; records still held
// are returned by Flush, which the caller must drain before Close.
func (e *Engine) Close() error {
	if c, ok := e.prov.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}
