package spool

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/internal/units"
)

// Config is the `agent.spool:` section.
type Config struct {
	// Dir holds the segments. Empty: <data_dir>/agent/spool (resolved by
	// the caller).
	Dir string `yaml:"dir"`
	// MaxBytes bounds the segments on disk (default 1GiB). A batch that
	// does not fit is lost and counted. 0 disables the spool: the agent
	// then retries each batch in memory, blocking its pipeline.
	MaxBytes units.ByteSize `yaml:"max_bytes"`
	// SegmentBytes is the size at which a segment is sealed and a new one
	// started (default 64MiB); consumed segments are deleted whole.
	SegmentBytes units.ByteSize `yaml:"segment_bytes"`
	// SyncInterval bounds how long an appended entry may stay unsynced
	// (default 1s): a kill -9 loses nothing, a power loss at most this.
	SyncInterval units.Duration `yaml:"sync_interval"`
}

// DefaultConfig returns the defaults; Dir is resolved by the caller.
func DefaultConfig() Config {
	return Config{MaxBytes: 1 << 30, SegmentBytes: 64 << 20, SyncInterval: units.Duration(time.Second)}
}

// Enabled reports whether the spool is on.
func (c Config) Enabled() bool { return c.MaxBytes > 0 }

// Validate reports every bad field.
func (c Config) Validate() error {
	var e units.Errors
	if !c.Enabled() {
		return nil
	}
	if c.Dir == "" {
		e.Add("dir", "empty", "set a directory on local disk, e.g. /var/lib/tapflow/agent/spool")
	}
	if c.MaxBytes < 1<<20 {
		e.Add("max_bytes", fmt.Sprintf("%s is below 1MiB", c.MaxBytes), "use e.g. 1GiB, or 0 to disable the spool")
	}
	if c.SegmentBytes < 64<<10 || c.SegmentBytes > 1<<30 {
		e.Add("segment_bytes", fmt.Sprintf("%s is outside [64KiB, 1GiB]", c.SegmentBytes), "use e.g. 64MiB")
	} else if c.MaxBytes >= 1<<20 && c.SegmentBytes > c.MaxBytes {
		e.Add("segment_bytes", fmt.Sprintf("%s exceeds max_bytes %s", c.SegmentBytes, c.MaxBytes), "use at most max_bytes/4, e.g. 64MiB")
	}
	if c.SyncInterval.D() < 0 || c.SyncInterval.D() > time.Minute {
		e.Add("sync_interval", fmt.Sprintf("%s is outside [0, 1m]", c.SyncInterval), "use e.g. 1s (0 syncs every append)")
	}
	return e.Err()
}
