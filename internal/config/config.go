// Package config is tapflow's one YAML config file: the top-level keys,
// their defaults, loading with unknown-key detection, and whole-file
// validation that reports every bad field with its path and the fix.
// Each section is owned by its component package (Config, DefaultConfig,
// Validate); this package only composes them. docs/config.md documents it.
package config

import (
	"os"
	"path/filepath"
	"time"

	"github.com/tapflow/tapflow/billing/cloudkitty"
	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
	"github.com/tapflow/tapflow/synthetic"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// Config is the whole file.
type Config struct {
	// Node names this host in records and in the NATS subject (default: hostname).
	Node string `yaml:"node"`
	// DataDir holds the embedded NATS store, agent state and, by default,
	// the collector output (default /var/lib/tapflow).
	DataDir string `yaml:"data_dir"`
	// Source is where records come from: synthetic (no root needed) or ebpf.
	Source string `yaml:"source"`
	// Synthetic configures source: synthetic.
	Synthetic synthetic.Config `yaml:"synthetic"`
	// Capture configures source: ebpf.
	Capture capture.Config `yaml:"capture"`
	// Inventory is where attribution metadata comes from.
	Inventory enrich.InventoryConfig `yaml:"inventory"`
	// Attribution tunes the enrich stage.
	Attribution AttributionConfig `yaml:"attribution"`
	// Agent tunes the agent pipeline.
	Agent AgentConfig `yaml:"agent"`
	// NATS is the transport.
	NATS transport.Config `yaml:"nats"`
	// Collector writes Parquet.
	Collector CollectorConfig `yaml:"collector"`
	// Metrics is the Prometheus endpoint.
	Metrics MetricsConfig `yaml:"metrics"`
	// Log configures logging.
	Log LogConfig `yaml:"log"`
	// Billing is the billing stage: exact hourly usage for CloudKitty and
	// tenant flow logs (docs/billing.md).
	Billing BillingConfig `yaml:"billing"`
}

// AttributionConfig is the `attribution:` section (see enrich.Config).
type AttributionConfig struct {
	// GhostGrace: a deleted port keeps attributing for this long (default 60s; 0 disables).
	GhostGrace units.Duration `yaml:"ghost_grace"`
	// LateBinding holds records of not-yet-known VM MACs for a while.
	LateBinding enrich.LateBindingConfig `yaml:"late_binding"`
	// MaxRouteHops bounds route next-hop resolution (default 16).
	MaxRouteHops int `yaml:"max_route_hops"`
	// SwapBarrier bounds the export of live flows before an
	// attribution-changing inventory swap (default 30s; 0 disables).
	SwapBarrier units.Duration `yaml:"swap_barrier"`
}

// AgentConfig is the `agent:` section.
type AgentConfig struct {
	// ID identifies this agent in record identities and Nats-Msg-Id (default: node).
	ID string `yaml:"id"`
	// EdgeCapacity is how many batches wait between stages (default 16).
	EdgeCapacity int `yaml:"edge_capacity"`
	// ShutdownTimeout bounds the graceful drain on SIGINT/SIGTERM (default 30s).
	ShutdownTimeout units.Duration `yaml:"shutdown_timeout"`
	// Spool keeps batches on disk while NATS is unreachable or slow.
	Spool spool.Config `yaml:"spool"`
}

// CollectorConfig is the `collector:` section: the Parquet writer and its
// JetStream consumer.
type CollectorConfig struct {
	Parquet  parquet.Config `yaml:",inline"`
	Consumer consume.Config `yaml:",inline"`
	// S3 configures the object store when output is s3://bucket/prefix.
	S3 s3out.Config `yaml:"s3"`
}

// MetricsConfig is the `metrics:` section.
type MetricsConfig struct {
	// Listen is the address of /metrics (default 127.0.0.1:9464; "" disables).
	Listen string `yaml:"listen"`
	// Pprof serves net/http/pprof under /debug/pprof/ on Listen (default
	// false: profiles show code paths and cost CPU; enable to debug).
	Pprof bool `yaml:"pprof"`
}

// LogConfig is the `log:` section.
type LogConfig struct {
	// Format is json (default, for production) or text.
	Format string `yaml:"format"`
	// Level is debug, info (default), warn or error.
	Level string `yaml:"level"`
}

// LogLevels and LogFormats are the values of log.level and log.format.
var (
	LogLevels  = []string{"debug", "info", "warn", "error"}
	LogFormats = []string{"json", "text"}
)

// Default returns the defaults for every field.
func Default() Config {
	host, _ := os.Hostname()
	e := enrich.DefaultConfig()
	return Config{
		Node:      host,
		DataDir:   "/var/lib/tapflow",
		Source:    "synthetic",
		Synthetic: synthetic.DefaultConfig(),
		Capture:   capture.DefaultConfig(),
		Inventory: e.Inventory,
		Attribution: AttributionConfig{
			GhostGrace: e.GhostGrace, LateBinding: e.LateBinding, MaxRouteHops: e.MaxRouteHops, SwapBarrier: e.SwapBarrier,
		},
		Agent:     AgentConfig{EdgeCapacity: 16, ShutdownTimeout: units.Duration(30 * time.Second), Spool: spool.DefaultConfig()},
		NATS:      transport.DefaultConfig(),
		Collector: CollectorConfig{Parquet: parquet.DefaultConfig(), Consumer: consume.DefaultConfig(), S3: s3out.DefaultConfig()},
		Metrics:   MetricsConfig{Listen: "127.0.0.1:9464"},
		Log:       LogConfig{Format: "json", Level: "info"},
		Billing:   BillingConfig{Usage: usage.DefaultConfig(), FlowLogs: flowlogs.DefaultConfig(), CloudKitty: cloudkitty.DefaultConfig()},
	}
}

// resolveOutput fills the staging directory of an s3:// output.
func (c *Config) resolveOutput() {
	if parquet.IsRemote(c.Collector.Parquet.Output) && c.Collector.Parquet.StagingDir == "" {
		c.Collector.Parquet.StagingDir = filepath.Join(c.DataDir, "staging")
	}
}

// validateOutput checks an s3:// output and its collector.s3 section.
func (c Config) validateOutput(e *units.Errors) {
	if !parquet.IsRemote(c.Collector.Parquet.Output) {
		return
	}
	if _, err := s3out.ParseTarget(c.Collector.Parquet.Output); err != nil {
		e.Add("collector.output", err.Error(), "use s3://bucket/prefix")
	}
	e.Merge("collector.s3", c.Collector.S3.Validate())
}
