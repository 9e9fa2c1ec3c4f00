package natsinv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

// Options configure a Provider.
type Options struct {
	// StatePath is the local copy of the last good snapshot (required).
	StatePath string
	// Resync is how often the head is re-read besides the watch (a watch
	// that missed an update across a reconnect); default 30 s.
	Resync time.Duration
	Logger *slog.Logger
	// Registry receives the metrics; nil: a private one.
	Registry prometheus.Registerer
}

// Provider is inventory.provider: nats. It implements enrich.Provider
// (Poll, Run, Updates, Guarded). Safe for concurrent use.
type Provider struct {
	nc   *nats.Conn
	opts Options
	log  *slog.Logger

	updatesTotal *prometheus.CounterVec
	versionG     prometheus.Gauge

	mu        sync.Mutex
	cur       *Snapshot // last good; nil before the first
	polled    uint64    // version Poll last returned
	lastBad   string    // version+reason last logged, to log once
	dirty     bool      // deltas applied since the local copy was written
	persisted time.Time // when it was last written

	stateOnce sync.Once // the local copy is read once
	ready     chan struct{}
	readyOnce sync.Once
	updates   chan struct{}

	// lagging, in tests, wraps the store so its head read lags the
	// announcements as the server's can (a stand-in for timing alone).
	lagging func(jetstream.ObjectStore) jetstream.ObjectStore
}

// Update results counted in tapflow_inventory_updates_total{result}.
var results = []string{"ok", "delta", "decode_error", "out_of_order", "fetch_error", "state_error"}

// NewProvider registers the metrics and reads nothing: the local copy is
// read by the first Poll, NATS by Run.
func NewProvider(nc *nats.Conn, o Options) (*Provider, error) {
	if nc == nil {
		return nil, errors.New("inventory provider nats: no NATS connection")
	}
	if o.StatePath == "" {
		return nil, errors.New("inventory provider nats: no state path for the local copy")
	}
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	p := &Provider{nc: nc, opts: o, log: o.Logger.With("component", "inventory", "provider", "nats"),
		ready: make(chan struct{}), updates: make(chan struct{}, 1)}
	p.updatesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_updates_total",
		Help: "Snapshots seen from NATS, by result: ok (snapshot downloaded and applied), delta (delta applied), decode_error, out_of_order (older than the one held), fetch_error (NATS or the bucket unreachable), state_error (local copy not written); all but ok keep the last good snapshot."},
		[]string{"result"})
	p.versionG = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_snapshot_version",
		Help: "Version of the service's snapshot held (0 before the first)."})
	age := inventory.AgeGauge(p.age)
	for _, c := range []prometheus.Collector{p.updatesTotal, p.versionG, age} {
		if err := o.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("inventory metrics: %w", err)
		}
	}
	for _, r := range results {
		p.updatesTotal.WithLabelValues(r)
	}
	return p, nil
}

func (p *Provider) age() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return -1
	}
	return time.Since(p.cur.FetchedAt).Seconds()
}

// Guarded: the service applied the drop guard before publishing.
func (p *Provider) Guarded() bool { return true }

// Updates receives (coalesced) when a newer snapshot is held.
func (p *Provider) Updates() <-chan struct{} { return p.updates }

// Current is the snapshot held (nil before the first).
func (p *Provider) Current() *Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Poll implements enrich.Provider. The first call loads the local copy;
// without one it waits for the first snapshot from NATS (or ctx), as the
// openstack provider's cold start does: capture waits for attribution.
// After that it never blocks.
func (p *Provider) Poll(ctx context.Context) (*inventory.Inventory, bool, error) {
	p.stateOnce.Do(p.loadState)
	select {
	case <-p.ready:
	default:
		if err := p.waitFirst(ctx); err != nil {
			return nil, false, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur.Version == p.polled {
		return nil, false, nil
	}
	p.polled = p.cur.Version
	return p.cur.Inv, true, nil
}

func (p *Provider) loadState() {
	s, err := readState(p.opts.StatePath)
	switch {
	case errors.Is(err, errNoState):
		p.log.Info("no local inventory copy yet; waiting for the first snapshot from NATS", "state", p.opts.StatePath)
		return
	case err != nil:
		p.updatesTotal.WithLabelValues("state_error").Inc()
		p.log.Warn("local inventory copy unusable; waiting for a snapshot from NATS", "err", err)
		return
	}
	p.log.Info("inventory loaded from the local copy; NATS updates it", "version", s.Version, "fetched", s.FetchedAt,
		"ports", len(s.Inv.Ports), "state", p.opts.StatePath)
	p.set(s, nil)
}

// waitFirst fetches the head until a snapshot is held or ctx ends.
func (p *Provider) waitFirst(ctx context.Context) error {
	backoff := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err := p.sync(ctx); err == nil {
			select {
			case <-p.ready:
				return nil
			default:
			}
		} else if attempt == 1 || attempt%10 == 0 {
			p.log.Warn("cold start: waiting for the first inventory snapshot from NATS; capture waits for it",
				"attempt", attempt, "err", err, "fix", "run tapflow inventory serve against this NATS (docs/inventory-service.md)")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("inventory provider nats: no snapshot yet: %w", ctx.Err())
		case <-p.ready: // Run got one
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// Run watches the bucket until ctx ends, re-reading the head every
// Resync; errors are logged and counted, the last good snapshot stays.
func (p *Provider) Run(ctx context.Context) error {
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		err := p.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		p.logBad("watch", "fetch_error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

func (p *Provider) watch(ctx context.Context) error {
	// A plain subscription to the snapshot's meta subject: every put
	// announces itself there, and it costs the server no consumer (a
	// fleet of agents each holding an Object Store watch would hit the
	// stream's consumer limit). Missed announcements (slow consumer, a
	// reconnect) are caught by the resync.
	// Deltas come on the same channel, so a delta is handled before the
	// announcement of the put that follows it.
	ch := make(chan *nats.Msg, 64)
	for _, subj := range []string{transport.InventoryDeltaSubject, transport.InventoryMetaSubject, transport.InventoryCurrentSubject} {
		sub, err := p.nc.ChanSubscribe(subj, ch)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", subj, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	js, err := jetstream.New(p.nc)
	if err != nil {
		return err
	}
	var obs jetstream.ObjectStore
	var st jetstream.Stream
	t := time.NewTicker(p.opts.Resync)
	defer t.Stop()
	// The server hands a put's announcement to subscribers before its
	// stream has stored it, so the head read that follows can still show
	// the version before: the announced version is read again shortly
	// rather than at the next resync.
	var lag announceLag
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		if obs == nil {
			if obs, st, err = open(ctx, js); err != nil {
				return err
			}
			if p.lagging != nil {
				obs = p.lagging(obs)
			}
		}
		if err := p.syncWith(ctx, obs, st); err != nil {
			return err
		}
		if d, again := lag.next(p.heldVersion()); again {
			retry.Reset(d)
		} else if lag.gaveUp() {
			p.log.Warn("an announced inventory version is not in the store; the resync reads the head again",
				"announced", lag.version, "held", p.heldVersion(), "resync", p.opts.Resync)
			lag = announceLag{}
		}
	wait:
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			if m.Subject == transport.InventoryDeltaSubject && p.applyDelta(m) {
				goto wait // the announcement that follows finds it current
			}
			if m.Subject == transport.InventoryCurrentSubject && p.touch(m) {
				goto wait
			}
			if m.Subject == transport.InventoryMetaSubject {
				lag.announced(announcedVersion(m.Data))
			}
		case <-retry.C:
		case <-t.C:
			p.persistDirty()
		}
	}
}

// heldVersion is the version held (0 before the first).
func (p *Provider) heldVersion() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.Version
}

// announceLag paces the re-reads of the head after an announcement of a
// version the head did not show yet: announceRetries reads, the first
// announceRetryFirst after, each wait twice the last.
type announceLag struct {
	version  uint64 // newest version announced and not yet held; 0: none
	attempts int
}

const (
	announceRetries    = 8
	announceRetryFirst = 25 * time.Millisecond
)

// announced notes a version an announcement named (0: unreadable).
func (l *announceLag) announced(v uint64) {
	if v > l.version {
		*l = announceLag{version: v}
	}
}

// next reports whether to read the head again, and after how long,
// given the version now held.
func (l *announceLag) next(held uint64) (time.Duration, bool) {
	if l.version == 0 || held >= l.version {
		*l = announceLag{}
		return 0, false
	}
	if l.attempts >= announceRetries {
		return 0, false
	}
	d := announceRetryFirst << l.attempts
	l.attempts++
	return d, true
}

// gaveUp: every re-read was made and the version is still not held.
func (l *announceLag) gaveUp() bool { return l.version != 0 && l.attempts >= announceRetries }

// announcedVersion is the snapshot version an announcement names: the
// message is the object's info (JSON) and the version is in its headers.
// 0 when it names none (not ours, or damaged): the head read decides.
func announcedVersion(data []byte) uint64 {
	var info jetstream.ObjectInfo
	if json.Unmarshal(data, &info) != nil {
		return 0
	}
	m, err := meta(info.Headers)
	if err != nil {
		return 0
	}
	return m.Version
}

// touch applies a "still current" note for the version held; false when
// it names another version (then the head is read).
func (p *Provider) touch(m *nats.Msg) bool {
	n, err := meta(m.Header)
	if err != nil {
		return true // not ours to act on
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil || n.Version != p.cur.Version {
		return p.cur != nil && n.Version < p.cur.Version
	}
	if n.FetchedAt.After(p.cur.FetchedAt) {
		c := *p.cur
		c.FetchedAt = n.FetchedAt
		p.cur = &c
	}
	return true
}

// stateEvery bounds how often deltas rewrite the local copy (each write
// encodes the whole inventory).
const stateEvery = time.Minute

// applyDelta applies a delta whose base is the version held; it reports
// whether it did.
func (p *Provider) applyDelta(m *nats.Msg) bool {
	base, s, ports, c, err := decodeDelta(m)
	if err != nil {
		p.logBad("delta", "decode_error", err)
		return false
	}
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	if cur == nil || cur.Version != base {
		return false // not our base: the snapshot download follows
	}
	inv := Apply(cur.Inv, c)
	if len(inv.Ports) != ports {
		p.logBad("delta", "decode_error", fmt.Errorf("delta %d->%d gives %d ports, the service has %d; downloading the snapshot", base, s.Version, len(inv.Ports), ports))
		return false
	}
	s.Inv = inv
	p.updatesTotal.WithLabelValues("delta").Inc()
	p.log.Info("inventory delta applied", "version", s.Version, "changed", c.Len(), "ports", ports, "bytes", len(m.Data))
	p.set(&s, nil)
	p.mu.Lock()
	p.dirty = true
	p.mu.Unlock()
	p.persistDirty()
	return true
}

// persistDirty writes the local copy after deltas, at most every
// stateEvery.
func (p *Provider) persistDirty() {
	p.mu.Lock()
	s, due := p.cur, p.dirty && time.Since(p.persisted) >= stateEvery
	if due {
		p.dirty, p.persisted = false, time.Now()
	}
	p.mu.Unlock()
	if !due {
		return
	}
	data, _, err := Encode(s.Inv)
	if err == nil {
		err = writeState(p.opts.StatePath, s, data)
	}
	if err != nil {
		p.updatesTotal.WithLabelValues("state_error").Inc()
		p.log.Error("local inventory copy not written; a restart without NATS would start from an older one", "err", err)
	}
}

// sync reads the head once (cold start).
func (p *Provider) sync(ctx context.Context) error {
	js, err := jetstream.New(p.nc)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	obs, st, err := open(cctx, js)
	if err != nil {
		return err
	}
	return p.syncWith(cctx, obs, st)
}

func open(ctx context.Context, js jetstream.JetStream) (jetstream.ObjectStore, jetstream.Stream, error) {
	obs, err := js.ObjectStore(ctx, transport.InventoryBucket)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s (has tapflow inventory serve run against this NATS?): %w", transport.InventoryBucket, err)
	}
	st, err := js.Stream(ctx, transport.InventoryStream)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", transport.InventoryStream, err)
	}
	return obs, st, nil
}

func (p *Provider) syncWith(ctx context.Context, obs jetstream.ObjectStore, st jetstream.Stream) error {
	info, err := obs.GetInfo(ctx, transport.InventoryObject)
	if err != nil {
		return fmt.Errorf("read %s/%s: %w", transport.InventoryBucket, transport.InventoryObject, err)
	}
	p.fetch(ctx, st, info)
	return nil
}

// fetch downloads and applies the object info describes, if newer.
func (p *Provider) fetch(ctx context.Context, st jetstream.Stream, info *jetstream.ObjectInfo) {
	m, err := meta(info.Headers)
	if err != nil {
		p.logBad(info.NUID, "decode_error", err)
		return
	}
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	if cur != nil && m.Version <= cur.Version {
		if m.Version < cur.Version {
			p.logBad(fmt.Sprint(m.Version), "out_of_order", fmt.Errorf("snapshot version %d is older than version %d held; kept", m.Version, cur.Version))
		}
		return
	}
	data, err := Download(ctx, st, info)
	if err != nil {
		// also when the object was replaced meanwhile (its chunks purged):
		// the announcement of the new one follows
		p.logBad(fmt.Sprint(m.Version), "fetch_error", fmt.Errorf("download version %d: %w", m.Version, err))
		return
	}
	inv, err := Decode(data)
	if err != nil {
		p.logBad(fmt.Sprint(m.Version), "decode_error", fmt.Errorf("snapshot version %d: %w", m.Version, err))
		return
	}
	m.Inv = inv
	p.set(&m, data)
}

// set makes s current, persists it (data: its encoding; nil when it came
// from the local copy) and signals Run's consumer.
func (p *Provider) set(s *Snapshot, data []byte) {
	p.mu.Lock()
	if p.cur != nil && s.Version <= p.cur.Version {
		p.mu.Unlock()
		return
	}
	p.cur = s
	p.mu.Unlock()
	p.versionG.Set(float64(s.Version))
	if data != nil {
		p.updatesTotal.WithLabelValues("ok").Inc()
		p.log.Info("inventory snapshot received", "version", s.Version, "fetched", s.FetchedAt, "ports", len(s.Inv.Ports), "bytes", len(data))
		p.mu.Lock()
		p.dirty, p.persisted = false, time.Now()
		p.mu.Unlock()
		if err := writeState(p.opts.StatePath, s, data); err != nil {
			p.updatesTotal.WithLabelValues("state_error").Inc()
			p.log.Error("local inventory copy not written; a restart without NATS would start from an older one", "err", err)
		}
	}
	p.readyOnce.Do(func() { close(p.ready) })
	select {
	case p.updates <- struct{}{}:
	default:
	}
}

// logBad counts a failed update and logs it once per key and reason.
func (p *Provider) logBad(key, result string, err error) {
	p.updatesTotal.WithLabelValues(result).Inc()
	p.mu.Lock()
	k := key + "\x00" + result + "\x00" + err.Error()
	repeat := p.lastBad == k
	p.lastBad = k
	var held uint64
	if p.cur != nil {
		held = p.cur.Version
	}
	p.mu.Unlock()
	if !repeat {
		p.log.Warn("inventory update not applied; attributing with the last good snapshot", "result", result, "held_version", held, "err", err)
	}
}
