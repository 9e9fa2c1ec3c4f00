package capture

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/units"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		paths  []string // FieldError paths expected; none = valid
	}{
		{"defaults", func(*Config) {}, nil},
		{"no interfaces", func(c *Config) { c.Interfaces = nil }, []string{"interfaces"}},
		{"bad glob", func(c *Config) { c.Interfaces = []string{"tap["} }, []string{"interfaces"}},
		{"budget too small", func(c *Config) { c.MemoryBudget = 64 << 10 }, []string{"memory_budget"}},
		{"active timeout too short", func(c *Config) { c.ActiveTimeout = units.Duration(time.Millisecond) }, []string{"active_timeout"}},
		{"sweep slower than idle", func(c *Config) { c.SweepInterval = units.Duration(time.Minute) }, []string{"sweep_interval"}},
		{"poll too fast", func(c *Config) { c.PollInterval = units.Duration(time.Microsecond) }, []string{"poll_interval"}},
		{"ring not a power of two", func(c *Config) { c.RingBufferSize = 3 << 20 }, []string{"ring_buffer_size"}},
		{"cache slots not a power of two", func(c *Config) { c.FlowCacheSlots = 100 }, []string{"flow_cache_slots"}},
		{"cache slots too many", func(c *Config) { c.FlowCacheSlots = 1 << 17 }, []string{"flow_cache_slots"}},
		{"unknown attach mode", func(c *Config) { c.AttachMode = "xdp" }, []string{"attach_mode"}},
		{"several at once", func(c *Config) { c.MaxInterfaces = 0; c.IdleTimeout = 0 }, []string{"max_interfaces", "idle_timeout", "sweep_interval"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if len(tc.paths) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %v", tc.paths)
			}
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *units.FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("not a FieldError: %v", e)
				}
				got = append(got, fe.Path)
				if fe.Fix == "" {
					t.Errorf("%s: no fix given", fe.Path)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.paths, ",") {
				t.Fatalf("paths %v, want %v (%v)", got, tc.paths, err)
			}
		})
	}
}

func TestSpecFromBudget(t *testing.T) {
	c := DefaultConfig()
	s, err := c.Spec(2)
	if err != nil {
		t.Fatal(err)
	}
	if s.RingBytes != 16<<20 || s.FlowEntries < 280_000 || s.Flow6Entries() < 70_000 || s.Interfaces != 1024 || s.ActiveTimeout != 10*time.Second {
		t.Fatalf("64MiB on 2 CPUs: %+v", s)
	}
	c.FlowTableEntries, c.RingBufferSize = 4, 1<<16
	if s, _ := c.Spec(2); s.FlowEntries != 4 || s.RingBytes != 1<<16 {
		t.Fatalf("overrides ignored: %+v", s)
	}
	c = DefaultConfig()
	c.FlowCacheSlots = 1 << 16 // 16 MiB per CPU: the budget pays for it
	if s, err := c.Spec(2); err != nil || s.CacheSlots != 1<<16 || s.FlowEntries > 200_000 {
		t.Fatalf("a 16 MiB-per-CPU cache on 2 CPUs: %+v, %v", s, err)
	}
	if _, err := c.Spec(4); err == nil {
		t.Fatal("a 64 MiB cache fits a 64 MiB budget")
	}
	if !c.Match("tap1234") || c.Match("eth0") {
		t.Fatal("default glob")
	}
}
