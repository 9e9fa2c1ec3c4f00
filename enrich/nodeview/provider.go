package nodeview

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

// Shared is the agent's source of the shared view: enrich/provider/natsinv's
// Provider.
type Shared interface {
	Poll(ctx context.Context) (*inventory.Inventory, bool, error)
	Run(ctx context.Context) error
	Updates() <-chan struct{}
}

// Provider is an agent's inventory with node-scoped views: the shared
// view from inner merged with its node's overlay, which it reads at start
// and then live on its node's subject. It implements enrich.Provider.
type Provider struct {
	inner Shared
	nc    *nats.Conn
	node  string
	state string // where the overlay is kept for a restart without NATS ("": nowhere)
	log   *slog.Logger

	updates chan struct{}
	ready   chan struct{} // closed at the first overlay
	results *prometheus.CounterVec
	once    sync.Once

	mu      sync.Mutex
	overlay *Overlay
	shared  *inventory.Inventory
	fresh   bool // overlay or shared view changed since the last Poll
}

// Options configure a Provider.
type Options struct {
	// Node is this agent's node: its overlay's subject.
	Node string
	// StatePath is the file the overlay is kept in (0600, next to
	// natsinv's copy of the shared view), so that a restart without NATS
	// attributes at once; "" keeps none.
	StatePath string
	Logger    *slog.Logger
	Registry  prometheus.Registerer
}

// overlayResults label tapflow_inventory_overlays_total.
var overlayResults = []string{"ok", "decode_error", "fetch_error", "state_error"}

// NewProvider validates its arguments and registers its metric; it
// contacts nothing.
func NewProvider(inner Shared, nc *nats.Conn, o Options) (*Provider, error) {
	node, state, log := o.Node, o.StatePath, o.Logger
	if inner == nil || nc == nil {
		return nil, errors.New("nodeview: the shared view's provider and a NATS connection are required")
	}
	if err := ValidNode(node); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	p := &Provider{inner: inner, nc: nc, node: node, state: state, log: log.With("component", "nodeview", "node", node),
		updates: make(chan struct{}, 1), ready: make(chan struct{})}
	p.results = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_overlays_total",
		Help: "This node's overlays (inventory.scope: node), by result: ok (held), decode_error (ignored), fetch_error (the bus did not answer; retried), state_error (not kept on disk); all but ok keep the overlay held."},
		[]string{"result"})
	if err := reg.Register(p.results); err != nil {
		return nil, fmt.Errorf("nodeview metrics: %w", err)
	}
	for _, r := range overlayResults {
		p.results.WithLabelValues(r)
	}
	return p, nil
}

// Guarded: the service applied the drop guard.
func (p *Provider) Guarded() bool { return true }

// Updates receives (coalesced) when the shared view or the overlay changed.
func (p *Provider) Updates() <-chan struct{} { return p.updates }

func (p *Provider) signal() {
	select {
	case p.updates <- struct{}{}:
	default:
	}
}

// set holds o (data: its encoding, kept in the state file when not nil).
func (p *Provider) set(o *Overlay, data []byte) {
	p.mu.Lock()
	p.overlay, p.fresh = o, true
	p.mu.Unlock()
	p.once.Do(func() { close(p.ready) })
	p.signal()
	p.results.WithLabelValues("ok").Inc()
	if data != nil && p.state != "" {
		if err := writeFile(p.state, data); err != nil {
			p.results.WithLabelValues("state_error").Inc()
			p.log.Warn("node overlay not kept on disk: a restart without NATS waits for it", "err", err)
		}
	}
}

// writeFile replaces path with data, 0600, atomically.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// load holds the overlay kept in the state file, if it is this node's.
func (p *Provider) load() bool {
	if p.state == "" {
		return false
	}
	data, err := os.ReadFile(p.state)
	if err != nil {
		return false
	}
	o, err := Decode(data)
	if err != nil || o.Node != p.node {
		p.log.Warn("kept node overlay ignored", "path", p.state, "err", err)
		return false
	}
	p.set(o, nil)
	return true
}

// Run runs the shared view's provider, subscribes to the node's overlay
// subject and reads the overlay until it has one; it returns when ctx
// ends.
func (p *Provider) Run(ctx context.Context) error {
	sub, err := p.nc.Subscribe(transport.InventoryNodeSubject(p.node), func(m *nats.Msg) {
		o, err := Decode(m.Data)
		if err != nil || o.Node != p.node {
			p.results.WithLabelValues("decode_error").Inc()
			p.log.Warn("node overlay ignored: it does not decode", "err", err)
			return
		}
		p.set(o, m.Data)
	})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	done := make(chan error, 1)
	go func() { done <- p.inner.Run(ctx) }()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.inner.Updates():
				p.signal()
			}
		}
	}()
	_ = p.fetch(ctx, false)
	return <-done
}

// first holds an overlay before the first Poll returns: the kept one,
// else the one on the bus (the engine's first Poll may come before Run).
func (p *Provider) first(ctx context.Context) error {
	select {
	case <-p.ready:
		return nil
	default:
	}
	if p.load() {
		return nil
	}
	return p.fetch(ctx, true)
}

// fetch reads the current overlay from the bus until it has it or ctx
// ends (untilReady: or until one is held from elsewhere).
func (p *Provider) fetch(ctx context.Context, untilReady bool) error {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		o, data, err := fetchRaw(fctx, p.nc, p.node)
		cancel()
		if err == nil {
			p.set(o, data)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.results.WithLabelValues("fetch_error").Inc()
		p.log.Info("waiting for this node's overlay", "err", err, "retry_in", wait)
		ready := p.ready
		if !untilReady {
			ready = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ready:
			return nil
		case <-time.After(wait):
		}
	}
}

// Poll implements enrich.Provider: the node's view once the shared view
// and the overlay are both held (the first call waits for them, as
// natsinv's does for its first snapshot).
func (p *Provider) Poll(ctx context.Context) (*inventory.Inventory, bool, error) {
	inv, changed, err := p.inner.Poll(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := p.first(ctx); err != nil {
		return nil, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if changed {
		p.shared, p.fresh = inv, true
	}
	if !p.fresh || p.shared == nil {
		return nil, false, nil
	}
	p.fresh = false
	return Merge(p.shared, p.overlay), true, nil
}
