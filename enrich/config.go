package enrich

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/units"
)

// Config is the enrich section of the tapflow config.
type Config struct {
	Inventory InventoryConfig `yaml:"inventory"`
	// GhostGrace is how long a port that left the inventory keeps
	// attributing its MAC (dying connections, FIN/RST). 0 disables.
	GhostGrace units.Duration `yaml:"ghost_grace"`
	// LateBinding holds records of not-yet-known VM MACs.
	LateBinding LateBindingConfig `yaml:"late_binding"`
	// MaxRouteHops bounds the extraroute next-hop trace.
	MaxRouteHops int `yaml:"max_route_hops"`
	// SwapBarrier bounds the swap barrier (WithExporter: the agent on
	// source ebpf): before an attribution-changing snapshot is swapped in,
	// the live flows are exported and attributed against the old one,
	// for at most this long. 0 turns the barrier off.
	SwapBarrier units.Duration `yaml:"swap_barrier"`
}

// InventoryConfig chooses and configures the inventory provider (package
// enrich/provider, which chooses it).
type InventoryConfig = provider.Config

// ServeConfig is `inventory.serve`: the metadata service.
type ServeConfig = provider.ServeConfig

// LookupConfig is `inventory.lookup` (package enrich/lookup).
type LookupConfig = provider.LookupConfig

// LateBindingConfig sizes the late-binding buffer.
type LateBindingConfig struct {
	// MaxRecords bounds the records held; 0 disables late binding
	// (unknown MACs are emitted as unknown/miss at once).
	MaxRecords int `yaml:"max_records"`
	// Window is how long a record waits for its MAC to become known.
	Window units.Duration `yaml:"window"`
}

// DefaultConfig returns the defaults: file provider polled every 5 s
// (openstack: refreshed every 5 min on the internal interface), a drop of
// more than 10 % (and 10) of the ports held until 3 reads confirm it, 60 s ghost
// grace, 10,000 records / 60 s late binding, 16 route hops.
func DefaultConfig() Config {
	return Config{
		Inventory: InventoryConfig{Provider: "file", Scope: "cloud", PollInterval: units.Duration(5 * time.Second),
			Refresh: units.Duration(5 * time.Minute), OpenStack: openstack.DefaultConfig(),
			MaxDropFraction: 0.1, DropConfirmReads: 3, DropMinPorts: 10, Serve: ServeConfig{Lease: units.Duration(15 * time.Second)},
			Lookup: LookupConfig{Interval: units.Duration(30 * time.Second), Timeout: units.Duration(2 * time.Second),
				Window: units.Duration(10 * time.Second), Rate: 0.2, Burst: 3}},
		GhostGrace:   units.Duration(60 * time.Second),
		LateBinding:  LateBindingConfig{MaxRecords: 10000, Window: units.Duration(60 * time.Second)},
		MaxRouteHops: 16,
		SwapBarrier:  units.Duration(DefaultBarrierTimeout),
	}
}

// Validate reports every invalid field as a *units.FieldError, joined.
func (c Config) Validate() error {
	var e units.Errors
	switch c.Inventory.Provider {
	case provider.File:
		if c.Inventory.File == "" {
			e.Add("inventory.file", "empty", "set the path of the inventory file (see docs/inventory.md)")
		}
	case provider.OpenStack:
		osc := c.Inventory.OpenStackConfig()
		if c.Inventory.Refresh.D() < time.Second {
			e.Add("inventory.refresh", fmt.Sprintf("%s is too short", c.Inventory.Refresh), "use at least 1s, e.g. 5m")
			osc.Refresh = units.Duration(5 * time.Minute) // reported above, not again below
		}
		e.Merge("inventory.openstack", osc.Validate())
	case provider.NATS: // NATS is the nats section's business
	default:
		e.Add("inventory.provider", fmt.Sprintf("%q is not a provider", c.Inventory.Provider), `use "file", "openstack" or "nats"`)
	}
	switch c.Inventory.Scope {
	case "", "cloud", "node":
	default:
		e.Add("inventory.scope", fmt.Sprintf("%q is not a scope", c.Inventory.Scope), `use "cloud" (every agent gets the whole inventory) or "node" (docs/security.md, What an agent sees)`)
	}
	if f := c.Inventory.MaxDropFraction; f < 0 || f > 1 || f != f {
		e.Add("inventory.max_drop_fraction", fmt.Sprintf("%g is not a fraction", f), "use 0..1, e.g. 0.1 (1 disables the guard)")
	}
	if c.Inventory.DropConfirmReads < 1 {
		e.Add("inventory.drop_confirm_reads", fmt.Sprintf("%d is below 1", c.Inventory.DropConfirmReads), "use e.g. 3")
	}
	if c.Inventory.DropMinPorts < 0 {
		e.Add("inventory.drop_min_ports", "negative", "use e.g. 10, or 0 to guard every drop above max_drop_fraction")
	}
	if c.Inventory.Serve.Lease.D() < time.Second {
		e.Add("inventory.serve.lease", fmt.Sprintf("%s is too short", c.Inventory.Serve.Lease), "use at least 1s, e.g. 15s")
	}
	e.Merge("inventory.lookup", c.Inventory.Lookup.Validate())
	if c.Inventory.PollInterval.D() < 100*time.Millisecond {
		e.Add("inventory.poll_interval", fmt.Sprintf("%s is too short", c.Inventory.PollInterval), "use at least 100ms, e.g. 5s")
	}
	if c.GhostGrace < 0 {
		e.Add("ghost_grace", "negative", "use e.g. 60s, or 0 to disable")
	}
	if c.LateBinding.MaxRecords < 0 {
		e.Add("late_binding.max_records", "negative", "use e.g. 10000, or 0 to disable late binding")
	}
	if c.LateBinding.MaxRecords > 0 && c.LateBinding.Window.D() <= 0 {
		e.Add("late_binding.window", "must be positive when late binding is on", "use e.g. 60s")
	}
	if d := c.SwapBarrier.D(); d < 0 || d > 10*time.Minute {
		e.Add("swap_barrier", fmt.Sprintf("%s is out of range", c.SwapBarrier), "use 0 (off) .. 10m, e.g. 30s")
	}
	if c.MaxRouteHops < 1 {
		e.Add("max_route_hops", fmt.Sprintf("%d is below 1", c.MaxRouteHops), "use e.g. 16")
	}
	return e.Err()
}
