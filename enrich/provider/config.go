package provider

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/units"
)

// Config is the inventory section of the tapflow config: Provider names
// the provider (Agent and Service choose it), the rest configures each.
type Config struct {
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
func (c Config) OpenStackConfig() openstack.Config {
	osc := c.OpenStack
	osc.Refresh = c.Refresh
	return osc
}
