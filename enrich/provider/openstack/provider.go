package openstack

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/inventory"
)

// Provider keeps an inventory of one OpenStack cloud current. It
// implements enrich.Provider. Safe for concurrent use.
type Provider struct {
	cfg    Config
	log    *slog.Logger
	creds  *creds
	m      *metrics
	getenv func(string) string

	minBackoff, maxBackoff time.Duration

	coldMu sync.Mutex // one cold start at a time
	passMu sync.Mutex // passes never overlap
	cl     *clients   // guarded by passMu

	mu           sync.Mutex
	inv          *inventory.Inventory // last complete inventory; never mutated
	hash         [sha256.Size]byte
	fetchedAt    time.Time
	gen          uint64 // bumped when a pass yields a different inventory
	reads        uint64 // bumped per complete pass, changed or not
	polledGen    uint64
	lastErr      error
	errSeq       uint64 // bumped per failed pass
	polledErrSeq uint64
	skippedLBs   map[string]bool   // LB ids of non-amphora providers, from the last LB list
	reported     map[string]string // best-effort collection -> last error logged
	skippedCount int
	lookupCl     *clients // p.cl once connected, for LookupMAC (which must not wait for a pass)

	ready     chan struct{}
	readyOnce sync.Once
	kick      chan struct{}
	updates   chan struct{}
}

// Option adjusts a Provider.
type Option func(*Provider)

// WithGetenv replaces os.Getenv for the OS_* variables (tests).
func WithGetenv(f func(string) string) Option { return func(p *Provider) { p.getenv = f } }

// WithBackoff sets the cold-start retry backoff bounds (default 1 s → 30 s).
func WithBackoff(min, max time.Duration) Option {
	return func(p *Provider) { p.minBackoff, p.maxBackoff = min, max }
}

// New validates cfg, resolves the credentials (clouds.yaml or OS_*; no
// network) and registers the metrics on reg. It contacts nothing and
// starts nothing.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("inventory.openstack config: %w", err)
	}
	p := &Provider{cfg: cfg, log: log, getenv: os.Getenv, minBackoff: time.Second, maxBackoff: 30 * time.Second,
		reported: map[string]string{}, skippedLBs: map[string]bool{},
		ready: make(chan struct{}), kick: make(chan struct{}, 1), updates: make(chan struct{}, 1)}
	for _, o := range opts {
		o(p)
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	c, err := resolveCreds(cfg, p.getenv)
	if err != nil {
		return nil, err
	}
	p.creds = c
	p.log = p.log.With("component", "inventory", "provider", "openstack")
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if p.m, err = newMetrics(reg, p.age); err != nil {
		return nil, fmt.Errorf("inventory metrics: %w", err)
	}
	return p, nil
}

// Source says where credentials and endpoints come from, e.g.
// `clouds.yaml entry "prod" (application credential, interface internal)`.
// It holds no secret.
func (p *Provider) Source() string {
	if p.cfg.NoAuth != nil {
		return fmt.Sprintf("noauth (neutron %s, nova %s, octavia %s)", p.cfg.NoAuth.Neutron, orNone(p.cfg.NoAuth.Nova), orNone(p.cfg.NoAuth.Octavia))
	}
	region := p.creds.eo.Region
	if region == "" {
		region = "any region"
	}
	return fmt.Sprintf("%s (%s auth at %s, interface %s, %s)", p.creds.source, p.creds.method, p.creds.ao.IdentityEndpoint, p.cfg.Interface, region)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (p *Provider) age() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fetchedAt.IsZero() {
		return -1
	}
	return time.Since(p.fetchedAt).Seconds()
}

// Ready is closed once the first complete inventory is in.
func (p *Provider) Ready() <-chan struct{} { return p.ready }

// Updates receives (coalesced) after each pass that changed the
// inventory, so a consumer can Poll at once instead of on its timer.
func (p *Provider) Updates() <-chan struct{} { return p.updates }

// Refresh asks Run for a reconcile pass now (SIGHUP, HTTP). It does not
// wait; requests made while a pass runs coalesce into one more pass.
// During the cold start it cuts the backoff short.
func (p *Provider) Refresh() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Reconcile runs one pass now, after any pass in progress, and returns its
// error (nil: the inventory is current).
func (p *Provider) Reconcile(ctx context.Context) error { return p.pass(ctx) }

// Reads counts the complete passes so far, changed or not: the drop
// guard (inventory.max_drop_fraction) confirms a held inventory only by
// fresh reads of the cloud, not by polls between passes.
func (p *Provider) Reads() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads
}

// Inventory returns the last complete inventory (nil before the first)
// and when it was fetched. The inventory must not be modified.
func (p *Provider) Inventory() (*inventory.Inventory, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inv, p.fetchedAt
}

// Poll implements enrich.Provider. Before the first complete inventory it
// performs the cold start and blocks until it succeeds or ctx is done: this
// is what holds capture back until attribution can work. After that it
// never blocks: it returns an inventory that differs from the last one it
// returned, or the error of a pass that failed since the last call (once),
// or (nil, false, nil).
func (p *Provider) Poll(ctx context.Context) (*inventory.Inventory, bool, error) {
	select {
	case <-p.ready:
	default:
		if err := p.coldStart(ctx); err != nil {
			return nil, false, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen != p.polledGen {
		p.polledGen, p.polledErrSeq = p.gen, p.errSeq
		return p.inv, true, nil
	}
	if p.errSeq != p.polledErrSeq {
		p.polledErrSeq = p.errSeq
		if p.lastErr != nil {
			return nil, false, p.lastErr
		}
	}
	return nil, false, nil
}

// Run performs the cold start (unless Poll did), then a pass every
// Config.Refresh and on each Refresh, until ctx is done. Failed passes are
// logged and counted; the last complete inventory stays. Returns nil when
// ctx is done.
func (p *Provider) Run(ctx context.Context) error {
	if err := p.coldStart(ctx); err != nil {
		return nil //nolint:nilerr // only ctx ends the cold start
	}
	t := time.NewTicker(p.cfg.Refresh.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-p.kick:
		}
		if err := p.pass(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("inventory pass failed; the last complete inventory stays in use",
				"age", time.Duration(p.age()*float64(time.Second)).Round(time.Second), "err", err)
		}
	}
}

// Close releases idle connections.
func (p *Provider) Close() error {
	p.passMu.Lock()
	defer p.passMu.Unlock()
	if p.cl != nil {
		p.cl.pc.HTTPClient.CloseIdleConnections()
	}
	return nil
}

func (p *Provider) waitsFor() string {
	s := "Neutron networks, subnets, ports, routers and floating IPs"
	if p.cfg.NoAuth == nil {
		s = "Keystone authentication and projects, " + s
	}
	return s
}

// coldStart passes with backoff until one completes or ctx is done.
func (p *Provider) coldStart(ctx context.Context) error {
	p.coldMu.Lock()
	defer p.coldMu.Unlock()
	select {
	case <-p.ready:
		return nil
	default:
	}
	start := time.Now()
	p.log.Info("cold start: fetching the OpenStack inventory; capture waits for it", "source", p.Source(), "waits_for", p.waitsFor())
	backoff := p.minBackoff
	for attempt := 1; ; attempt++ {
		err := p.pass(ctx)
		if err == nil {
			inv, _ := p.Inventory()
			p.log.Info("cold start: first complete OpenStack inventory", "attempts", attempt, "took", time.Since(start).Round(time.Millisecond),
				"ports", len(inv.Ports), "networks", len(inv.Networks), "servers", len(inv.Servers), "loadbalancers", len(inv.LoadBalancers))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Warn("cold start: waiting for the first complete OpenStack inventory; capture stays detached until then",
			"waits_for", p.waitsFor(), "attempt", attempt, "retry_in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		case <-p.kick:
		}
		backoff = min(backoff*2, p.maxBackoff)
	}
}

// pass fetches everything once and, if the required collections were read,
// makes the result the current inventory.
func (p *Provider) pass(ctx context.Context) error {
	p.passMu.Lock()
	defer p.passMu.Unlock()
	start := time.Now()
	inv, stale, err := p.fetch(ctx)
	p.m.passSeconds.Set(time.Since(start).Seconds())
	if err != nil {
		err = p.scrub(err)
		p.m.passes.WithLabelValues("error").Inc()
		p.mu.Lock()
		p.lastErr = err
		p.errSeq++
		p.mu.Unlock()
		return err
	}
	sortInventory(inv)
	sum, err := hashInventory(inv)
	if err != nil {
		return fmt.Errorf("openstack inventory: %w", err)
	}
	p.mu.Lock()
	changed := p.inv == nil || sum != p.hash
	if changed {
		p.inv, p.hash = inv, sum
		p.gen++
	}
	p.fetchedAt = time.Now()
	p.reads++
	p.lastErr = nil
	p.mu.Unlock()
	p.m.passes.WithLabelValues("ok").Inc()
	for _, c := range bestEffort {
		v := 0.0
		if slices.Contains(stale, c) {
			v = 1
		}
		p.m.stale.WithLabelValues(c).Set(v)
	}
	for coll, n := range counts(inv) {
		p.m.objects.WithLabelValues(coll).Set(float64(n))
	}
	if changed {
		select {
		case p.updates <- struct{}{}:
		default:
		}
	}
	p.readyOnce.Do(func() { close(p.ready) })
	lvl := slog.LevelDebug
	if changed {
		lvl = slog.LevelInfo
	}
	p.log.Log(ctx, lvl, "inventory pass", "changed", changed, "took", time.Since(start).Round(time.Millisecond),
		"projects", len(inv.Projects), "networks", len(inv.Networks), "ports", len(inv.Ports), "routers", len(inv.Routers),
		"servers", len(inv.Servers), "loadbalancers", len(inv.LoadBalancers), "amphorae", len(inv.Amphorae), "stale", stale)
	return nil
}

func counts(inv *inventory.Inventory) map[string]int {
	return map[string]int{"projects": len(inv.Projects), "networks": len(inv.Networks), "subnets": len(inv.Subnets),
		"ports": len(inv.Ports), "routers": len(inv.Routers), "floatingips": len(inv.FloatingIPs), "servers": len(inv.Servers),
		"loadbalancers": len(inv.LoadBalancers), "amphorae": len(inv.Amphorae), "pools": len(inv.Pools), "trunks": len(inv.Trunks)}
}

// count records err on tapflow_inventory_errors_total.
func (p *Provider) count(err error) {
	var fe *FetchError
	if errors.As(err, &fe) {
		if fe.Code != "canceled" {
			p.m.errors.WithLabelValues(fe.Endpoint, fe.Code).Inc()
		}
		return
	}
	if !errors.Is(err, context.Canceled) {
		p.m.errors.WithLabelValues("unknown", "other").Inc()
	}
}

func canceled(err error) bool {
	var fe *FetchError
	return errors.Is(err, context.Canceled) || (errors.As(err, &fe) && fe.Code == "canceled")
}

// fetch reads every collection. Required ones failing fail the pass;
// best-effort ones failing are served from the previous inventory and
// named in stale.
func (p *Provider) fetch(ctx context.Context) (*inventory.Inventory, []string, error) {
	if p.cl == nil {
		cl, err := p.connect(ctx)
		if err != nil {
			p.count(err)
			return nil, nil, err
		}
		p.cl = cl
		p.mu.Lock()
		p.lookupCl = cl
		p.mu.Unlock()
		if len(cl.absent) > 0 {
			p.log.Info("services not in use (their collections stay empty)", "services", cl.absent)
		}
	}
	cl := p.cl
	prev, _ := p.Inventory()
	if prev == nil {
		prev = &inventory.Inventory{}
	}
	inv := &inventory.Inventory{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	var mu sync.Mutex
	var required []error
	var stale []string
	req := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				p.count(err)
				mu.Lock()
				if !canceled(err) || len(required) == 0 {
					required = append(required, err)
				}
				mu.Unlock()
				cancel()
			}
		}()
	}
	// bestEff runs f; on failure it restores the previous values and
	// reports the collection stale.
	bestEff := func(coll string, f func() error, restore func()) {
		if err := f(); err != nil {
			restore()
			if canceled(err) {
				return // the pass is failing anyway
			}
			p.count(err)
			mu.Lock()
			stale = append(stale, coll)
			mu.Unlock()
			p.reportStale(coll, err)
			return
		}
		p.reportStale(coll, nil)
	}
	req(func() error {
		s, err := list[inventory.Network](ctx, p, cl.network, colNetworks)
		inv.Networks = s
		return err
	})
	req(func() error {
		s, err := list[inventory.Subnet](ctx, p, cl.network, colSubnets)
		inv.Subnets = s
		return err
	})
	req(func() error { s, err := list[inventory.Port](ctx, p, cl.network, colPorts); inv.Ports = s; return err })
	req(func() error {
		s, err := list[inventory.Router](ctx, p, cl.network, colRouters)
		inv.Routers = s
		return err
	})
	req(func() error {
		s, err := list[inventory.FloatingIP](ctx, p, cl.network, colFloatingIPs)
		inv.FloatingIPs = s
		return err
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		bestEff("trunks", func() error {
			s, err := list[inventory.Trunk](ctx, p, cl.network, colTrunks)
			var fe *FetchError
			if errors.As(err, &fe) && fe.Code == "404" {
				// the trunk extension is not enabled: no trunks
				inv.Trunks = nil
				return nil
			}
			inv.Trunks = s
			return err
		}, func() { inv.Trunks = slices.Clone(prev.Trunks) })
	}()
	if cl.identity != nil {
		req(func() error {
			s, err := list[inventory.Project](ctx, p, cl.identity, colProjects)
			inv.Projects = s
			return err
		})
	}
	if cl.compute != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bestEff("servers", func() error {
				s, err := list[inventory.Server](ctx, p, cl.compute, colServers)
				inv.Servers = s
				return err
			}, func() { inv.Servers = slices.Clone(prev.Servers) })
		}()
	}
	if cl.loadBalancer != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.fetchOctavia(ctx, cl, prev, inv, bestEff)
		}()
	}
	wg.Wait()
	if len(required) > 0 {
		return nil, nil, errors.Join(required...)
	}
	return inv, stale, nil
}

// fetchOctavia lists load balancers (skipping non-amphora providers),
// amphorae and pools with their members; each falls back on its own.
func (p *Provider) fetchOctavia(ctx context.Context, cl *clients, prev, inv *inventory.Inventory, bestEff func(string, func() error, func())) {
	p.mu.Lock()
	skipped := p.skippedLBs
	p.mu.Unlock()
	bestEff("loadbalancers", func() error {
		lbs, err := list[inventory.LoadBalancer](ctx, p, cl.loadBalancer, colLoadBalancers)
		if err != nil {
			return err
		}
		kept := lbs[:0:0]
		skipped = map[string]bool{}
		byProvider := map[string]int{}
		for _, lb := range lbs {
			if amphoraProvider(lb.Provider) {
				kept = append(kept, lb)
				continue
			}
			skipped[lb.ID] = true
			byProvider[lb.Provider]++
		}
		inv.LoadBalancers = kept
		p.m.skipped.Reset()
		for prov, n := range byProvider {
			p.m.skipped.WithLabelValues(prov).Set(float64(n))
		}
		p.mu.Lock()
		p.skippedLBs = skipped
		changed := len(skipped) != p.skippedCount
		p.skippedCount = len(skipped)
		p.mu.Unlock()
		if len(skipped) > 0 && changed {
			p.log.Warn("load balancers of non-amphora providers skipped: their traffic is not re-attributed to the LB owner",
				"count", len(skipped), "by_provider", byProvider)
		}
		return nil
	}, func() { inv.LoadBalancers = slices.Clone(prev.LoadBalancers) })
	bestEff("amphorae", func() error {
		amps, err := list[inventory.Amphora](ctx, p, cl.loadBalancer, colAmphorae)
		if err != nil {
			return err
		}
		inv.Amphorae = slices.DeleteFunc(amps, func(a inventory.Amphora) bool { return skipped[a.LoadBalancerID] })
		return nil
	}, func() { inv.Amphorae = slices.Clone(prev.Amphorae) })
	bestEff("pools", func() error {
		pools, err := list[inventory.Pool](ctx, p, cl.loadBalancer, colPools)
		if err != nil {
			return err
		}
		pools = slices.DeleteFunc(pools, func(pl inventory.Pool) bool {
			if len(pl.LoadBalancers) == 0 {
				return false
			}
			for _, r := range pl.LoadBalancers {
				if !skipped[r.ID] {
					return false
				}
			}
			return true
		})
		if err := p.fetchMembers(ctx, cl, pools); err != nil {
			return err
		}
		inv.Pools = pools
		return nil
	}, func() { inv.Pools = slices.Clone(prev.Pools) })
}

// reportStale logs a best-effort collection's failure when it starts or
// changes, and its recovery.
func (p *Provider) reportStale(coll string, err error) {
	p.mu.Lock()
	last := p.reported[coll]
	msg := ""
	if err != nil {
		msg = p.redact(err.Error())
	}
	p.reported[coll] = msg
	p.mu.Unlock()
	switch {
	case err != nil && msg != last:
		p.log.Warn("best-effort collection failed; its previous values stay in use", "collection", coll, "err", msg)
	case err == nil && last != "":
		p.log.Info("best-effort collection recovered", "collection", coll)
	}
}

func byID[T any](id func(*T) string) func(a, b T) int {
	return func(a, b T) int { return cmp.Compare(id(&a), id(&b)) }
}

// sortInventory orders every collection by id, so equal clouds hash and
// dump the same.
func sortInventory(inv *inventory.Inventory) {
	slices.SortFunc(inv.Projects, byID(func(o *inventory.Project) string { return o.ID }))
	slices.SortFunc(inv.Networks, byID(func(o *inventory.Network) string { return o.ID }))
	slices.SortFunc(inv.Subnets, byID(func(o *inventory.Subnet) string { return o.ID }))
	slices.SortFunc(inv.Ports, byID(func(o *inventory.Port) string { return o.ID }))
	slices.SortFunc(inv.Routers, byID(func(o *inventory.Router) string { return o.ID }))
	slices.SortFunc(inv.FloatingIPs, byID(func(o *inventory.FloatingIP) string { return o.ID }))
	slices.SortFunc(inv.Servers, byID(func(o *inventory.Server) string { return o.ID }))
	slices.SortFunc(inv.LoadBalancers, byID(func(o *inventory.LoadBalancer) string { return o.ID }))
	slices.SortFunc(inv.Amphorae, byID(func(o *inventory.Amphora) string { return o.ID }))
	slices.SortFunc(inv.Pools, byID(func(o *inventory.Pool) string { return o.ID }))
	for i := range inv.Pools {
		// the members slice may be shared with the previous inventory: sort a copy
		ms := slices.Clone(inv.Pools[i].Members)
		slices.SortFunc(ms, byID(func(o *inventory.Member) string { return o.ID }))
		inv.Pools[i].Members = ms
	}
}

func hashInventory(inv *inventory.Inventory) ([sha256.Size]byte, error) {
	b, err := json.Marshal(inv)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}
