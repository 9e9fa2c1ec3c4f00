package app

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"

	"github.com/tapflow/tapflow/internal/config"
)

// TestCollectorMemoryLimit: a collector process gets a soft memory limit
// from its settings (2 sinks' open files + in-flight messages + runtime),
// and GOMEMLIMIT, when set, wins.
func TestCollectorMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name   string
		change func(*config.Config)
		env    string
		want   int64
	}{
		{name: "defaults", want: 832 << 20},
		{name: "fewer open files, smaller messages", change: func(c *config.Config) {
			c.Collector.Parquet.MaxOpenFiles = 2
			c.Collector.Consumer.MaxMessageBytes = 16 << 20
		}, want: 2*2*(16+16)<<20 + 4*16<<20 + 64<<20},
		{name: "row groups capped by roll_size", change: func(c *config.Config) {
			c.Collector.Parquet.RowGroupRows = 1 << 20 // 64 MiB estimated, above roll_size
			c.Collector.Parquet.RollSize = 8 << 20
			c.Collector.Parquet.MaxOpenFiles = 4
		}, want: 2*4*(16+8)<<20 + 4*64<<20 + 64<<20},
		{name: "GOMEMLIMIT wins", env: "300MiB", want: 300 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Collector.Parquet.Output = t.TempDir()
			if tc.change != nil {
				tc.change(&cfg)
			}
			if err := cfg.Collector.Parquet.Validate(); err != nil {
				t.Fatal(err)
			}
			t.Setenv("GOMEMLIMIT", tc.env)
			if tc.env != "" {
				debug.SetMemoryLimit(tc.want) // what the runtime read from the variable at start
			}
			if got := setCollectorMemoryLimit(cfg, log); got != tc.want {
				t.Fatalf("limit %d MiB; want %d MiB", got>>20, tc.want>>20)
			}
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Fatalf("runtime limit %d MiB; want %d MiB", got>>20, tc.want>>20)
			}
		})
	}
}
