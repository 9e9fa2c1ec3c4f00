package enrich

import (
	"fmt"
	"time"

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

// InventoryConfig chooses and configures the inventory provider.
type InventoryConfig struct {
	// Provider is "file", "openstack" or "nats" (snapshots that
	// `tapflow inventory serve` publishes; NATS credentials only).
	Provider string `yaml:"provider"`
	// Scope is what agents get of the inventory: "cloud" (default: the
	// whole inventory) or "node" (node-scoped views, enrich/nodeview:
	// `tapflow inventory serve` publishes a shared view without names,
	// placement or other nodes' ids and each node's overlay; agents with
	// provider "nats" merge their node's). Service and agents must agree.
	Scope string `yaml:"scope"`
	// File is the inventory file (YAML or JSON) for provider "file".
	File string `yaml:"file"`
	// PollInterval is how often the provider is checked for changes (for
	// openstack: for a newer fetched inventory, and for expired ghosts).
	PollInterval units.Duration `yaml:"poll_interval"`
	// Refresh is how often provider "openstack" re-reads the cloud (a
	// reconcile pass); Engine.Refresh asks for one at once.
	Refresh units.Duration `yaml:"refresh"`
	// MaxDropFraction: an inventory that lost more than this fraction of
	// the previous one's ports is held back (the previous stays in use)
	// until DropConfirmReads consecutive reads show the drop or an
	// operator confirms it. 1 disables the guard.
	MaxDropFraction float64 `yaml:"max_drop_fraction"`
	// DropConfirmReads is how many consecutive reads of the source (the
	// first included) confirm a held drop.
	DropConfirmReads int `yaml:"drop_confirm_reads"`
	// DropMinPorts: a drop of at most this many ports is never held (a
	// small cloud loses whole percents with each deleted VM).
	DropMinPorts int `yaml:"drop_min_ports"`
	// Serve configures `tapflow inventory serve` (which reads the
	// cloud through provider "file" or "openstack").
	Serve ServeConfig `yaml:"serve"`
	// Lookup tunes the targeted lookups of unknown VM MACs: the agent's
	// side (provider "nats") and the service's.
	Lookup LookupConfig `yaml:"lookup"`
	// OpenStack configures provider "openstack" (auth, interface,
	// region, ...); see package enrich/provider/openstack.
	OpenStack openstack.Config `yaml:"openstack"`
}

// ServeConfig is `inventory.serve`: the metadata service.
type ServeConfig struct {
	// Lease is how long a serve instance holds the publisher lease
	// without renewing it: a takeover after a crash takes at most this.
	Lease units.Duration `yaml:"lease"`
	// Instance names this instance in the lease (default: node).
	Instance string `yaml:"instance"`
	// KeyFile holds the pseudonym key of node-scoped views (scope
	// "node"): at least 16 bytes, the same file for every serve
	// instance, not readable by other users.
	KeyFile string `yaml:"key_file"`
}

// LookupConfig is `inventory.lookup` (package enrich/lookup).
type LookupConfig struct {
	// Interval (agent): a MAC is asked at most once per interval.
	Interval units.Duration `yaml:"interval"`
	// Timeout (agent): one request waits this long for the reply.
	Timeout units.Duration `yaml:"timeout"`
	// Window (service): the same MAC asked again within it, by any
	// agent, costs no new provider query.
	Window units.Duration `yaml:"window"`
	// Rate (service): provider queries per second on average; Burst how
	// many at once.
	Rate  float64 `yaml:"rate"`
	Burst int     `yaml:"burst"`
}

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
	case "file":
		if c.Inventory.File == "" {
			e.Add("inventory.file", "empty", "set the path of the inventory file (see docs/inventory.md)")
		}
	case "openstack":
		osc := c.Inventory.OpenStackConfig()
		if c.Inventory.Refresh.D() < time.Second {
			e.Add("inventory.refresh", fmt.Sprintf("%s is too short", c.Inventory.Refresh), "use at least 1s, e.g. 5m")
			osc.Refresh = units.Duration(5 * time.Minute) // reported above, not again below
		}
		e.Merge("inventory.openstack", osc.Validate())
	case "nats": // NATS is the nats section's business
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

// Validate checks inventory.lookup (paths relative to it).
func (c LookupConfig) Validate() error {
	var e units.Errors
	if d := c.Interval.D(); d < 100*time.Millisecond || d > time.Hour {
		e.Add("interval", fmt.Sprintf("%s is out of range", c.Interval), "use 100ms..1h, e.g. 30s (half of late_binding.window: a MAC gets a second chance within it)")
	}
	if d := c.Timeout.D(); d < 10*time.Millisecond || d > time.Minute {
		e.Add("timeout", fmt.Sprintf("%s is out of range", c.Timeout), "use 10ms..1m, e.g. 2s")
	}
	if d := c.Window.D(); d < 100*time.Millisecond || d > time.Hour {
		e.Add("window", fmt.Sprintf("%s is out of range", c.Window), "use 100ms..1h, e.g. 10s")
	}
	if r := c.Rate; !(r > 0) || r > 1000 {
		e.Add("rate", fmt.Sprintf("%g is out of range", r), "use queries per second above 0 and at most 1000, e.g. 0.2 (one per 5 s)")
	}
	if c.Burst < 1 || c.Burst > 10000 {
		e.Add("burst", fmt.Sprintf("%d is out of range", c.Burst), "use 1..10000, e.g. 3")
	}
	return e.Err()
}

// OpenStackConfig is the openstack provider's config with Refresh filled
// in from inventory.refresh.
func (c InventoryConfig) OpenStackConfig() openstack.Config {
	osc := c.OpenStack
	osc.Refresh = c.Refresh
	return osc
}
