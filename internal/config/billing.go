package config

import (
	"path/filepath"

	"github.com/tapflow/tapflow/billing/cloudkitty"
	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/units"
)

// BillingConfig is the `billing:` section: exact hourly usage published
// for CloudKitty (billing/usage). Each billing component owns one field.
type BillingConfig struct {
	Usage usage.Config `yaml:",inline"`
	// FlowLogs delivers each project's flow records of a closed hour to
	// its own S3 location (billing/flowlogs).
	FlowLogs flowlogs.Config `yaml:"flow_logs"`
	// CloudKitty is the reprocess hook told about corrections
	// (billing/cloudkitty).
	CloudKitty cloudkitty.Config `yaml:"cloudkitty"`
}

// resolveBilling fills billing.data (collector.output), billing.state_dir
// (<data_dir>/billing), billing.flow_logs.staging_dir
// (<data_dir>/flowlogs-staging) and, when 0, billing.settle (from the pipeline's
// delays: usage.DeriveSettle).
func (c *Config) resolveBilling() {
	u := &c.Billing.Usage
	if u.Data == "" {
		u.Data = c.Collector.Parquet.Output
	}
	if u.StateDir == "" {
		u.StateDir = filepath.Join(c.DataDir, "billing")
	}
	if c.Billing.FlowLogs.StagingDir == "" {
		c.Billing.FlowLogs.StagingDir = filepath.Join(c.DataDir, "flowlogs-staging")
	}
	if u.Settle == 0 {
		u.Settle = units.Duration(usage.DeriveSettle(c.Collector.Parquet.RollAge.D(), c.Capture.ActiveTimeout.D(), c.Attribution.LateBinding.Window.D()))
	}
}
