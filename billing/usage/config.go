package usage

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/internal/units"
)

// Config is the `billing:` section's own keys (billing.*; the CloudKitty
// and flow-log keys live in their packages' sections next to it).
type Config struct {
	// Data is the collector output to bill from: a directory or
	// s3://bucket/prefix (default: collector.output; an s3:// one is read
	// with the collector.s3 settings).
	Data string `yaml:"data"`
	// StateDir keeps what was published per hour (default
	// <data_dir>/billing).
	StateDir string `yaml:"state_dir"`
	// Settle: an hour [H, H+1h) is closed at H+1h+Settle. Zero (the
	// default) derives it from the pipeline's own delays: collector.roll_age
	// + capture.active_timeout + attribution.late_binding.window +
	// SettleMargin.
	Settle units.Duration `yaml:"settle"`
	// Interval between passes of `tapflow billing run` (default 5m).
	Interval units.Duration `yaml:"interval"`
	// Lookback: hours that ended longer ago are no longer looked at, so
	// late files there are not billed (default 168h; keep it within the
	// receiver's out_of_order_time_window, which must accept them).
	Lookback units.Duration `yaml:"lookback"`
	// RatedAfter: an hour first published this long or more after its end
	// was rated without it, so the rating side is asked to rate it again
	// (CloudKitty rates the period starting at H once wait_periods periods
	// have passed since H: (wait_periods − 1) × period after the hour's
	// end; default 1h for CloudKitty's wait_periods 2 × period 3600s;
	// 0: never).
	RatedAfter units.Duration `yaml:"rated_after"`
	// Prometheus is the remote-write receiver CloudKitty reads from.
	Prometheus promwrite.Config `yaml:"prometheus"`
}

// SettleMargin is added to the pipeline's delays in the derived settle:
// NATS delivery, an upload to S3, clocks.
const SettleMargin = 5 * time.Minute

// DefaultConfig returns the defaults (Data and StateDir are filled from the
// rest of the config by Resolve, Settle by DeriveSettle).
func DefaultConfig() Config {
	return Config{
		Interval:   units.Duration(5 * time.Minute),
		Lookback:   units.Duration(7 * 24 * time.Hour),
		RatedAfter: units.Duration(time.Hour),
		Prometheus: promwrite.DefaultConfig(),
	}
}

// DeriveSettle is the settle used when billing.settle is 0: the longest a
// record of a closed hour can still be on its way to a committed file.
func DeriveSettle(rollAge, activeTimeout, lateBinding time.Duration) time.Duration {
	return rollAge + activeTimeout + lateBinding + SettleMargin
}

// Validate reports every invalid field as a *units.FieldError. The
// prometheus section is checked only when a URL is set or required: the
// commands that publish require it (ValidatePublish).
func (c Config) Validate() error {
	var e units.Errors
	if c.Settle.D() < 0 {
		e.Add("settle", fmt.Sprintf("%s is negative", c.Settle), "use e.g. 15m, or 0 to derive it from collector.roll_age and the late-record window")
	}
	if c.Interval.D() < time.Second {
		e.Add("interval", fmt.Sprintf("%s is below 1s", c.Interval), "use e.g. 5m")
	}
	if c.RatedAfter.D() < 0 {
		e.Add("rated_after", fmt.Sprintf("%s is negative", c.RatedAfter), "use CloudKitty's (wait_periods − 1) × period (e.g. 1h), or 0")
	}
	if c.Lookback.D() < time.Hour {
		e.Add("lookback", fmt.Sprintf("%s is below 1h", c.Lookback), "use e.g. 168h (within Prometheus' out_of_order_time_window)")
	}
	if c.Prometheus.URL != "" {
		e.Merge("prometheus", c.Prometheus.Validate())
	}
	return e.Err()
}
