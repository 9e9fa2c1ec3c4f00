// Package invserve is `tapflow inventory serve`: one poller per cloud. It
// reads the cloud through a provider (openstack or file), holds back a
// snapshot that lost too many ports (inventory.max_drop_fraction), and
// publishes each new inventory to NATS (package enrich/provider/natsinv),
// where every agent picks it up with NATS credentials only.
//
// Several instances may run: they share a lease (natsinv.Lease); only the
// holder reads the cloud and publishes, so the APIs see one poller. The
// others wait, and take over within the lease TTL when the holder stops
// or loses NATS. A publish never repeats content the store already has,
// so a takeover or restart republishes nothing.
package invserve

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

// Source is what the service reads: enrich.Provider's Poll, plus
// optionally Run (its own loop), Updates and Reads, as the openstack
// provider has them.
type Source interface {
	Poll(ctx context.Context) (*inventory.Inventory, bool, error)
}

// Config tunes the service.
type Config struct {
	// Instance names this instance in the lease (default: hostname-pid).
	Instance string
	// Lease is the lease TTL: how long a takeover may take.
	Lease time.Duration
	// PollInterval is how often the source is polled.
	PollInterval time.Duration
	// Guard is the drop guard (inventory.max_drop_fraction, ...).
	Guard inventory.DropGuard
	// Replicas of the JetStream buckets.
	Replicas int
	// Lookup tunes the targeted lookups agents send (package lookup).
	Lookup lookup.ServerOptions
	// Views, when set (inventory.scope: node), publishes the shared view
	// in place of the whole inventory and each node's overlay
	// (enrich/nodeview); nil publishes the whole inventory.
	Views *nodeview.Builder
}

// Service publishes inventories. Run it once; Close is a no-op kept for
// the lifecycle convention.
type Service struct {
	cfg Config
	src Source
	js  jetstream.JetStream
	log *slog.Logger

	leader     prometheus.Gauge
	published  *prometheus.CounterVec
	bytes      prometheus.Gauge
	deltaBytes prometheus.Gauge
	took       prometheus.Gauge
	held       prometheus.Gauge
	heldTotal  prometheus.Counter
	confirmed  *prometheus.CounterVec

	mu         sync.Mutex
	guard      inventory.DropGuard
	last       *inventory.Inventory // last published (or adopted) inventory, whole
	lastPub    *inventory.Inventory // what the store holds of it: last, or its shared view (Views)
	lastDigest string               // lastPub's digest once published by this instance
	overlays   map[string][]byte    // Views: each node's last published overlay, encoded
	built      *nodeview.Overlays   // Views: every node's overlay of the last inventory indexed
	heldSums   map[string]string    // Views: Sum of each overlay the stream held at start, until compared
	overlaysN  *prometheus.CounterVec
	reads      uint64
	confirm    chan struct{}

	lookups *lookup.Server
	lookup  chan struct{} // a lookup asks for a read now (coalesced)
	macs    chan string   // targeted lookups for a macLooker source
}

// macLooker sources answer a targeted lookup without a full read
// (openstack: GET /v2.0/ports?mac_address=…); changed is signalled on
// Updates.
type macLooker interface {
	LookupMAC(ctx context.Context, mac string) (changed bool, err error)
}

// readNow asks lead for a full read (coalesced: one pending at most).
func (s *Service) readNow() {
	select {
	case s.lookup <- struct{}{}:
	default: // a read is already asked for: it serves this MAC too
	}
}

// lookMACs runs the targeted lookups; one that fails (or finds a port on
// a network the inventory lacks) falls back to a full read.
func (s *Service) lookMACs(ctx context.Context, l macLooker) {
	for {
		select {
		case <-ctx.Done():
			return
		case mac := <-s.macs:
			if _, err := l.LookupMAC(ctx, mac); err != nil && ctx.Err() == nil {
				s.log.Info("targeted lookup incomplete; reading the whole cloud now", "mac", mac, "err", err)
				s.readNow()
			}
		}
	}
}

// New validates cfg and registers the metrics; it contacts nothing.
func New(cfg Config, src Source, js jetstream.JetStream, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if src == nil || js == nil {
		return nil, fmt.Errorf("inventory serve: source and JetStream are required")
	}
	if cfg.Lease < time.Second {
		return nil, fmt.Errorf("inventory serve: lease %s: use at least 1s", cfg.Lease)
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s := &Service{cfg: cfg, src: src, js: js, log: log.With("component", "inventory-serve", "instance", cfg.Instance),
		guard: cfg.Guard, confirm: make(chan struct{}, 1), lookup: make(chan struct{}, 1), macs: make(chan string, 64)}
	cfg.Lookup.Registry = reg
	ls, err := lookup.NewServer(func(mac string) {
		if _, ok := src.(macLooker); ok {
			select {
			case s.macs <- mac:
				return
			default: // too many at once: one full read serves them all
			}
		}
		s.readNow()
	}, cfg.Lookup)
	if err != nil {
		return nil, fmt.Errorf("inventory serve: %w", err)
	}
	s.lookups = ls
	s.leader = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_serve_leader", Help: "1 while this instance holds the lease and publishes."})
	s.published = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_serve_publishes_total",
		Help: "Publish attempts, by result: ok, unchanged (the store had this content), error."}, []string{"result"})
	s.bytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_serve_snapshot_bytes", Help: "Encoded size of the last snapshot published (what each agent downloads)."})
	s.deltaBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_serve_delta_bytes", Help: "Size of the delta sent before the last snapshot (0: none: first version, or the delta would not have been much smaller)."})
	s.took = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_serve_publish_seconds", Help: "Time the last publish took (encode and put)."})
	guard := inventory.NewGuardMetrics()
	s.held, s.heldTotal, s.confirmed = guard.Held, guard.HeldTotal, guard.Confirmed
	s.overlaysN = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_serve_overlays_total",
		Help: "Node overlays (inventory.scope: node), by result: ok (published), error (not published: retried at the next publish)."}, []string{"result"})
	for _, c := range []prometheus.Collector{s.leader, s.published, s.bytes, s.deltaBytes, s.took, s.held, s.heldTotal, s.confirmed, s.overlaysN} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("inventory serve metrics: %w", err)
		}
	}
	for _, r := range []string{"ok", "unchanged", "error"} {
		s.published.WithLabelValues(r)
	}
	s.overlaysN.WithLabelValues("ok")
	s.overlaysN.WithLabelValues("error")
	return s, nil
}

// ConfirmDrop publishes a held inventory at once (the operator's
// command); it reports whether one was held.
func (s *Service) ConfirmDrop() bool {
	s.mu.Lock()
	_, held := s.guard.Holding()
	s.mu.Unlock()
	if held {
		select {
		case s.confirm <- struct{}{}:
		default:
		}
	}
	return held
}

// Run creates the buckets, then contends for the lease and, while it
// holds it, runs the source and publishes, until ctx ends. NATS errors are
// logged and retried. Returns nil when ctx is done.
func (s *Service) Run(ctx context.Context) error {
	var obs jetstream.ObjectStore
	var lease *natsinv.Lease
	backoff := time.Second
	for {
		var err error
		if obs == nil {
			obs, err = natsinv.EnsureStore(ctx, s.js, natsinv.StoreConfig{Replicas: s.cfg.Replicas})
		}
		if err == nil && lease == nil {
			lease, err = natsinv.NewLease(ctx, s.js, s.cfg.Instance, s.cfg.Lease, s.cfg.Replicas)
		}
		if err == nil && s.cfg.Views != nil {
			err = nodeview.EnsureStream(ctx, s.js, s.cfg.Replicas)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("inventory serve: JetStream not ready; retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	tick := time.NewTicker(lease.TTL() / 3)
	defer tick.Stop()
	standbyLogged := false
	for {
		ok, err := lease.Try(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("inventory serve: lease", "err", err)
		}
		if ok {
			standbyLogged = false
			s.lead(ctx, lease, obs, tick.C)
			continue
		}
		if !standbyLogged {
			s.log.Info("inventory serve: standby; another instance publishes", "leader", lease.Holder(ctx), "lease", lease.TTL())
			standbyLogged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// lead runs the source and publishes while the lease holds.
func (s *Service) lead(ctx context.Context, lease *natsinv.Lease, obs jetstream.ObjectStore, renew <-chan time.Time) {
	s.leader.Set(1)
	defer s.leader.Set(0)
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		if ctx.Err() != nil {
			rctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			_ = lease.Release(rctx) // a clean stop hands over at once
			c()
		}
	}()
	s.log.Info("inventory serve: lease held; reading the cloud and publishing", "lease", lease.TTL())
	if r, ok := s.src.(interface{ Run(context.Context) error }); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(lctx); err != nil {
				s.log.Error("inventory source loop stopped", "err", err)
			}
		}()
	}
	// Adopt what the store holds so the guard compares against it.
	s.mu.Lock()
	adopt := s.last == nil
	s.mu.Unlock()
	if adopt {
		s.adopt(lctx, obs)
	}
	var updates <-chan struct{}
	if u, ok := s.src.(interface{ Updates() <-chan struct{} }); ok {
		updates = u.Updates()
	}
	// Targeted lookups are answered by the leader only: it reads the cloud.
	if sub, err := s.lookups.Subscribe(s.js.Conn()); err != nil {
		s.log.Warn("inventory serve: targeted lookups not served; agents wait for the next read", "err", err)
	} else {
		defer func() { _ = sub.Unsubscribe() }()
	}
	refresher, _ := s.src.(interface{ Refresh() })
	if l, ok := s.src.(macLooker); ok {
		wg.Add(1)
		go func() { defer wg.Done(); s.lookMACs(lctx, l) }()
	}
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()
	polled := make(chan struct{}, 1)
	go func() { // the first Poll may block (openstack cold start): keep renewing meanwhile
		defer close(polled)
		s.step(lctx, obs, false)
	}()
	// again: a read was asked for while the first was under way, which
	// may have listed the cloud before the change asked about.
	again := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew:
			if ok, err := lease.Try(ctx); !ok {
				s.log.Warn("inventory serve: lease lost; standing by", "err", err)
				return
			}
			continue
		case <-polled:
			polled = nil
			if !again {
				continue
			}
			again = false
		case <-poll.C:
			if polled != nil {
				continue // the first read is this one
			}
		case <-updates:
		case <-s.lookup:
			if refresher != nil { // openstack: a pass now; Updates signals its end
				refresher.Refresh()
				continue
			}
		case <-s.confirm:
			if polled == nil {
				s.step(lctx, obs, true)
			}
			continue
		}
		if polled != nil {
			again = true
			continue
		}
		s.step(lctx, obs, false)
	}
}

// adopt reads the published snapshot, if any, as the guard's baseline.
func (s *Service) adopt(ctx context.Context, obs jetstream.ObjectStore) {
	data, err := obs.GetBytes(ctx, transport.InventoryObject)
	if err != nil {
		return // nothing published yet, or unreadable: the first read is the baseline
	}
	inv, err := natsinv.Decode(data)
	if err != nil {
		s.log.Warn("inventory serve: the published snapshot does not decode; it is replaced by the next read", "err", err)
		return
	}
	s.mu.Lock()
	if s.last == nil {
		// With views the store holds the shared view: as many ports as
		// the whole, which is what the guard compares.
		s.last, s.lastPub = inv, inv
	}
	s.mu.Unlock()
}

// step polls the source once, passes the result through the guard and
// publishes what it lets through (confirm: the operator's confirmation).
func (s *Service) step(ctx context.Context, obs jetstream.ObjectStore, confirm bool) {
	inv, changed, err := s.src.Poll(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("inventory serve: source not read; the published snapshot stays", "err", err)
		}
		return
	}
	fresh := true
	if r, ok := s.src.(interface{ Reads() uint64 }); ok {
		n := r.Reads()
		fresh, s.reads = n != s.reads, n
	}
	s.mu.Lock()
	_, wasHeld := s.guard.Holding()
	var apply *inventory.Inventory
	by := "reads"
	switch {
	case changed:
		apply = s.guard.Offer(s.last, inv)
	case fresh:
		apply = s.guard.Reread()
	}
	if apply == nil && confirm {
		apply, by = s.guard.Confirm(), "operator"
	}
	h, held := s.guard.Holding()
	if !held && apply == nil && !changed && s.last != nil && s.lastDigest != "" {
		// nothing new: keep the store in step (NATS restarted without its
		// store, the object deleted by hand) by a cheap look at its head,
		// and tell agents the cloud was read (their age metric)
		if head, ok, err := natsinv.Head(ctx, obs); err == nil && (!ok || head.Digest != s.lastDigest) {
			apply = s.last
		} else if err == nil && fresh {
			_ = s.js.Conn().PublishMsg(natsinv.CurrentMsg(head.Version, s.fetchedAt()))
		}
	}
	s.mu.Unlock()
	if held {
		s.held.Set(1)
		if !wasHeld {
			s.heldTotal.Inc()
			s.log.Warn("inventory held back: it lost too many ports at once; agents keep the published snapshot",
				"ports_before", h.PrevPorts, "ports_now", h.Ports, "drop", fmt.Sprintf("%.1f%%", 100*h.Drop()),
				"max_drop_fraction", s.guard.MaxDrop, "confirm_after_reads", h.Needed,
				"fix", "if the cloud really shrank, wait for the reads or confirm now: tapflow inventory confirm --config FILE")
		}
		return
	}
	s.held.Set(0)
	if wasHeld && apply != nil {
		s.confirmed.WithLabelValues(by).Inc()
		s.log.Warn("held inventory confirmed; publishing it", "by", by, "ports", len(apply.Ports))
	}
	if apply == nil {
		return
	}
	fetched := s.fetchedAt()
	s.mu.Lock()
	prev, prevDigest := s.lastPub, s.lastDigest
	s.mu.Unlock()
	pub := apply
	var idx *nodeview.Index
	if s.cfg.Views != nil {
		idx = s.cfg.Views.NewIndex(apply)
		pub = idx.Shared()
		// Overlays first: an agent then never holds a shared view with a
		// port of its node that its overlay does not name yet (it would
		// attribute that VM with pseudonyms); an overlay ahead of the
		// shared view only names ports the agent does not see yet.
		s.publishOverlays(ctx, idx)
	}
	res, err := natsinv.PublishFrom(ctx, s.js.Conn(), obs, prev, prevDigest, pub, fetched)
	if err != nil {
		s.published.WithLabelValues("error").Inc()
		if ctx.Err() == nil {
			s.log.Warn("inventory serve: publish failed; retried at the next poll", "err", err)
		}
		return
	}
	s.mu.Lock()
	s.last, s.lastPub, s.lastDigest = apply, res.Inv, res.Digest
	if idx == nil {
		s.last = res.Inv
	}
	s.mu.Unlock()
	if res.Skipped {
		s.published.WithLabelValues("unchanged").Inc()
		return
	}
	s.published.WithLabelValues("ok").Inc()
	s.bytes.Set(float64(res.Bytes))
	s.deltaBytes.Set(float64(res.DeltaBytes))
	s.took.Set(res.Took.Seconds())
	s.log.Info("inventory snapshot published", "version", res.Version, "ports", len(apply.Ports), "bytes", res.Bytes, "delta_bytes", res.DeltaBytes, "took", res.Took.Round(time.Millisecond))
}

// publishOverlays publishes the overlays that changed since this
// instance last published them, for the nodes with a VM port. Only the
// overlays whose inputs changed are rebuilt (nodeview.Overlays): a change
// costs the nodes it touches. After a start or takeover it compares its
// overlays with the sums the stream holds and republishes only those
// that differ (all of them when the sums cannot be read: a repeat is
// harmless, the stream keeps one per node).
func (s *Service) publishOverlays(ctx context.Context, idx *nodeview.Index) {
	if s.overlays == nil {
		s.overlays = map[string][]byte{}
		sums, err := nodeview.HeldSums(ctx, s.js)
		if err != nil {
			s.log.Info("inventory serve: the overlays the stream holds are not known; republishing every one", "err", err)
		}
		s.heldSums = sums
	}
	if s.built == nil {
		s.built = nodeview.NewOverlays()
	}
	rebuilt, full := s.built.Update(idx)
	if full != "" && len(s.overlays) > 0 {
		s.log.Debug("every node overlay rebuilt", "why", full)
	}
	sent, failed := 0, 0
	for _, node := range idx.Nodes() {
		data, vm, err := s.built.Encoded(node)
		if !vm && err == nil {
			continue // a network node: no agent attributes from it
		}
		if err == nil && bytes.Equal(data, s.overlays[node]) {
			continue
		}
		if sum, ok := s.heldSums[node]; ok && err == nil {
			delete(s.heldSums, node)
			if sum == nodeview.Sum(data) {
				s.overlays[node] = data // the stream has it: published by the previous leader
				continue
			}
		}
		if err == nil {
			err = nodeview.PublishEncoded(ctx, s.js, node, data)
		}
		if err != nil {
			s.overlaysN.WithLabelValues("error").Inc()
			delete(s.overlays, node) // retried at the next publish
			if failed++; failed == 1 && ctx.Err() == nil {
				s.log.Warn("inventory serve: node overlay not published; its agent keeps the previous one", "node", node, "err", err)
			}
			continue
		}
		s.overlays[node] = data
		s.overlaysN.WithLabelValues("ok").Inc()
		sent++
	}
	if sent > 0 || failed > 0 {
		s.log.Info("node overlays published", "changed", sent, "failed", failed, "rebuilt", len(rebuilt))
	}
}

// fetchedAt is when the source last read the cloud (openstack: its last
// complete pass), else now.
func (s *Service) fetchedAt() time.Time {
	if f, ok := s.src.(interface {
		Inventory() (*inventory.Inventory, time.Time)
	}); ok {
		if _, at := f.Inventory(); !at.IsZero() {
			return at
		}
	}
	return time.Now()
}

// Close releases nothing (Run released the lease); for the lifecycle.
func (s *Service) Close() error { return nil }
