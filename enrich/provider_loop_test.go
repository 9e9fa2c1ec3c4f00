package enrich

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/inventory"
)

// loopProvider has its own loop, signals updates and takes refreshes, as
// the openstack provider does.
type loopProvider struct {
	mu        sync.Mutex
	next      *inventory.Inventory
	ran       atomic.Bool
	refreshes atomic.Int32
	updates   chan struct{}
}

func (p *loopProvider) Poll(context.Context) (*inventory.Inventory, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	inv := p.next
	p.next = nil
	return inv, inv != nil, nil
}

func (p *loopProvider) Run(ctx context.Context) error {
	p.ran.Store(true)
	<-ctx.Done()
	return nil
}

func (p *loopProvider) Updates() <-chan struct{} { return p.updates }
func (p *loopProvider) Refresh()                 { p.refreshes.Add(1) }

func TestRunDrivesProviderLoop(t *testing.T) {
	p := &loopProvider{updates: make(chan struct{}, 1)}
	cfg := DefaultConfig()
	cfg.Inventory.PollInterval = units.Duration(time.Hour) // only updates and Refresh wake Run
	e, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), WithProvider(p))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()

	waitFor := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !f(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the provider's Run", p.ran.Load)
	p.mu.Lock()
	p.next = &inventory.Inventory{Networks: []inventory.Network{{ID: "n1", ProjectID: "t1"}}}
	p.mu.Unlock()
	p.updates <- struct{}{}
	waitFor("a snapshot after the update signal", func() bool { return e.Snapshot().Version() == 1 })

	e.Refresh()
	if p.refreshes.Load() != 1 {
		t.Errorf("provider refreshes %d, want 1", p.refreshes.Load())
	}
	p.mu.Lock()
	p.next = &inventory.Inventory{}
	p.mu.Unlock()
	e.Refresh() // the engine also polls at once
	waitFor("a snapshot after Refresh", func() bool { return e.Snapshot().Version() == 2 })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return (it waits for the provider's loop)")
	}
}
