// Package provider chooses the inventory provider: the one place where
// inventory.provider (Config.Provider) becomes a source of inventories,
// for an agent (Agent: file, openstack, nats with node-scoped views and
// targeted lookups, or the synthetic source's own cloud), for
// `tapflow inventory serve` (Service: file or openstack), for
// `tapflow inventory dump` (Dump) and for `tapflow validate` (Check).
// enrich.New uses Agent when it is given no provider.
//
// The providers themselves are the packages below it
// (enrich/provider/openstack, enrich/provider/natsinv), enrich/nodeview
// and inventory (the file); this package imports nothing of enrich, so
// enrich can use it.
package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/inventory"
)

// The values of inventory.provider.
const (
	File      = "file"      // a static inventory file, re-read when it changes
	OpenStack = "openstack" // Keystone, Neutron, Nova and Octavia
	NATS      = "nats"      // snapshots `tapflow inventory serve` publishes
)

// Synthetic names the synthetic source's own cloud in Chosen.Name.
const Synthetic = "synthetic"

// Provider yields inventories (enrich.Provider, invserve.Source).
type Provider interface {
	Poll(ctx context.Context) (inv *inventory.Inventory, changed bool, err error)
}

// Env is what a provider needs besides its configuration.
type Env struct {
	Logger *slog.Logger
	// Registry receives the provider's metrics; nil: a private one.
	Registry prometheus.Registerer
	// NC is the process's NATS connection (provider nats).
	NC *nats.Conn
	// Node is this agent's node (provider nats, scope node: its overlay).
	Node string
	// StatePath is the agent's local copy of the last snapshot (provider
	// nats; the overlay's is StatePath.overlay).
	StatePath string
	// Synthetic is the synthetic source's own cloud: the agent's provider
	// when inventory.file is empty and the provider is not nats.
	Synthetic Provider
}

// Chosen is an agent's provider and what comes with it.
type Chosen struct {
	Provider Provider
	// Name is what was chosen: File, OpenStack, NATS or Synthetic.
	Name string
	// Asker asks the service for unknown VM MACs (provider nats; else
	// nil): the Engine's enrich.WithUnknownVM.
	Asker *lookup.Asker
}

// Agent chooses an agent's provider (and the Engine's when it is given
// none): the synthetic source's cloud when env has one, inventory.file is
// empty and the provider is not nats; otherwise inventory.provider, for
// nats merged with the node's overlay (scope node) and with targeted
// lookups. Scope node needs provider nats.
func Agent(c Config, env Env) (Chosen, error) {
	if env.Synthetic != nil && c.File == "" && c.Provider != NATS {
		return Chosen{Provider: env.Synthetic, Name: Synthetic}, nil
	}
	if c.Scope == "node" && c.Provider != NATS {
		return Chosen{}, fmt.Errorf("inventory.scope: node: an agent reads node-scoped views from tapflow inventory serve: set inventory.provider: nats (with %q it would read the whole inventory)", c.Provider)
	}
	if c.Provider != NATS {
		p, err := open(c, env)
		return Chosen{Provider: p, Name: c.Provider}, err
	}
	if env.NC == nil {
		return Chosen{}, errors.New("inventory.provider nats needs the process's NATS connection")
	}
	// Snapshots from `tapflow inventory serve`: NATS credentials only.
	p, err := natsinv.NewProvider(env.NC, natsinv.Options{StatePath: env.StatePath, Logger: env.Logger, Registry: env.Registry})
	if err != nil {
		return Chosen{}, err
	}
	ch := Chosen{Provider: p, Name: NATS}
	if c.Scope == "node" {
		// the shared view merged with this node's overlay
		if ch.Provider, err = nodeview.NewProvider(p, env.NC, nodeview.Options{Node: env.Node, StatePath: env.StatePath + ".overlay", Logger: env.Logger, Registry: env.Registry}); err != nil {
			return Chosen{}, fmt.Errorf("inventory.scope: node: %w", err)
		}
	}
	// Unknown VM MACs are asked of the service at once (docs/inventory-service.md).
	if ch.Asker, err = lookup.NewAsker(env.NC, lookup.AskerOptions{Interval: c.Lookup.Interval.D(),
		Timeout: c.Lookup.Timeout.D(), Logger: env.Logger, Registry: env.Registry}); err != nil {
		return Chosen{}, err
	}
	return ch, nil
}

// ServiceCheck refuses a provider `tapflow inventory serve` cannot read
// the cloud with (all but openstack and file), before anything starts.
func ServiceCheck(c Config) error {
	if c.Provider != OpenStack && c.Provider != File {
		return fmt.Errorf("inventory serve reads the cloud: inventory.provider is %q; set it to openstack (or file)", c.Provider)
	}
	return nil
}

// Service chooses what `tapflow inventory serve` reads the cloud with:
// provider openstack or file (ServiceCheck).
func Service(c Config, env Env) (Provider, error) {
	if err := ServiceCheck(c); err != nil {
		return nil, err
	}
	p, err := open(c, env)
	if o, ok := p.(*openstack.Provider); ok && env.Logger != nil {
		env.Logger.Info("inventory serve: reading OpenStack", "source", o.Source())
	}
	return p, err
}

// open is provider file or openstack.
func open(c Config, env Env) (Provider, error) {
	switch c.Provider {
	case OpenStack:
		log := env.Logger
		if log == nil {
			log = slog.Default()
		}
		reg := env.Registry
		if reg == nil {
			reg = prometheus.NewRegistry()
		}
		p, err := openstack.New(c.OpenStackConfig(), log, reg)
		if err != nil {
			return nil, err
		}
		return p, nil
	case File:
		f, err := inventory.NewFile(c.File)
		if err != nil {
			return nil, err
		}
		return fileProvider{f}, nil
	}
	return nil, fmt.Errorf("inventory.provider %q is not a provider: use %q, %q or %q", c.Provider, File, OpenStack, NATS)
}

// fileProvider is provider file.
type fileProvider struct{ f *inventory.File }

func (p fileProvider) Poll(context.Context) (*inventory.Inventory, bool, error) { return p.f.Poll() }

// KeepsNothing: the file provider holds no copy of what it returned (it
// re-reads the file), so whoever keeps the inventory may trim it.
func (fileProvider) KeepsNothing() bool { return true }

// Dump writes what provider c sees in the static inventory file format
// (openstack: one read of the cloud; file: the file).
func Dump(ctx context.Context, c Config, log *slog.Logger, w io.Writer) error {
	switch c.Provider {
	case OpenStack:
		return openstack.Dump(ctx, c.OpenStackConfig(), log, w)
	case File:
		inv, err := inventory.Load(c.File)
		if err != nil {
			return err
		}
		return openstack.WriteInventory(w, inv)
	}
	return fmt.Errorf("inventory.provider %q cannot be dumped", c.Provider)
}

// Check is what start-up would fail on before reading anything: for
// provider openstack, credentials (clouds.yaml or OS_*) that resolve.
func Check(c Config) error {
	if c.Provider == OpenStack {
		if err := openstack.CheckAuth(c.OpenStackConfig()); err != nil {
			return fmt.Errorf("inventory.openstack: %w", err)
		}
	}
	return nil
}

// FilePath is the static inventory file the provider reads ("" unless
// provider file).
func FilePath(c Config) string {
	if c.Provider == File {
		return c.File
	}
	return ""
}
