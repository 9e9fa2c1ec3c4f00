package nodeview

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/enrich/inventory"
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
	log   *slog.Logger

	updates chan struct{}
	ready   chan struct{} // closed at the first overlay
	once    sync.Once

	mu      sync.Mutex
	overlay *Overlay
	shared  *inventory.Inventory
	fresh   bool // overlay or shared view changed since the last Poll
}

// NewProvider validates its arguments; it contacts nothing.
func NewProvider(inner Shared, nc *nats.Conn, node string, log *slog.Logger) (*Provider, error) {
	if inner == nil || nc == nil {
		return nil, errors.New("nodeview: the shared view's provider and a NATS connection are required")
	}
	if err := ValidNode(node); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Provider{inner: inner, nc: nc, node: node, log: log.With("component", "nodeview", "node", node),
		updates: make(chan struct{}, 1), ready: make(chan struct{})}, nil
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

// set holds o if it is this node's.
func (p *Provider) set(o *Overlay) {
	p.mu.Lock()
	p.overlay, p.fresh = o, true
	p.mu.Unlock()
	p.once.Do(func() { close(p.ready) })
	p.signal()
}

// Run runs the shared view's provider, subscribes to the node's overlay
// subject and reads the overlay until it has one; it returns when ctx
// ends.
func (p *Provider) Run(ctx context.Context) error {
	sub, err := p.nc.Subscribe(Subject(p.node), func(m *nats.Msg) {
		o, err := Decode(m.Data)
		if err != nil || o.Node != p.node {
			p.log.Warn("node overlay ignored: it does not decode", "err", err)
			return
		}
		p.set(o)
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
	_ = p.first(ctx)
	return <-done
}

// first reads the overlay until it has one (from here or the
// subscription) or ctx ends: the engine's first Poll may come before Run.
func (p *Provider) first(ctx context.Context) error {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		select {
		case <-p.ready:
			return nil
		default:
		}
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		o, err := Fetch(fctx, p.nc, p.node)
		cancel()
		if err == nil {
			p.mu.Lock()
			have := p.overlay != nil
			p.mu.Unlock()
			if !have {
				p.set(o)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Info("waiting for this node's overlay", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.ready:
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
