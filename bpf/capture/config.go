package capture

import (
	"fmt"
	"path"
	"runtime"
	"time"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/units"
)

// Config is the `capture:` section.
type Config struct {
	// Interfaces are shell globs of interface names to capture.
	Interfaces []string `yaml:"interfaces"`
	// MemoryBudget bounds kernel memory: ring buffer, meters and flow table
	// are derived from it and the CPU count.
	MemoryBudget units.ByteSize `yaml:"memory_budget"`
	// FlowTableEntries overrides the derived flow-table size (0 = derive):
	// the IPv4 table's entries; the IPv6 table has a quarter of them.
	FlowTableEntries int `yaml:"flow_table_entries"`
	// FlowCacheSlots is the per-CPU flow cache's size in slots per
	// generation (0 = 256), a power of two ≤ 65536: the flows a CPU counts
	// without touching the shared table.
	FlowCacheSlots int `yaml:"flow_cache_slots"`
	// RingBufferSize overrides the derived ring size (0 = derive); a power of two.
	RingBufferSize units.ByteSize `yaml:"ring_buffer_size"`
	// MaxInterfaces is how many interfaces can be attached at once.
	MaxInterfaces int `yaml:"max_interfaces"`
	// ActiveTimeout exports long-lived flows at least this often.
	ActiveTimeout units.Duration `yaml:"active_timeout"`
	// IdleTimeout exports and forgets flows without packets for this long.
	IdleTimeout units.Duration `yaml:"idle_timeout"`
	// SweepInterval is how often idle flows are looked for.
	SweepInterval units.Duration `yaml:"sweep_interval"`
	// PollInterval is how often the ring buffer is drained.
	PollInterval units.Duration `yaml:"poll_interval"`
	// MeterInterval is how often meter deltas are published.
	MeterInterval units.Duration `yaml:"meter_interval"`
	// RescanInterval is how often interfaces are listed to repair attachments.
	RescanInterval units.Duration `yaml:"rescan_interval"`
	// AttachMode is auto (tcx, else tc), tcx or tc (clsact + cls_bpf).
	AttachMode attach.Mode `yaml:"attach_mode"`
	// PinDir is the bpffs directory where the links and maps are pinned so
	// the programs keep counting across a restart and the next start adopts
	// what they counted ("" = no pinning: every stop detaches). Every stop
	// exports the flows either way.
	PinDir string `yaml:"pin_dir"`
	// Detach is the --detach flag, not configuration: see Options.Detach.
	Detach bool `yaml:"-"`
}

// DefaultPinDir is the default capture.pin_dir.
const DefaultPinDir = "/sys/fs/bpf/tapflow"

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Interfaces:     []string{"tap*"},
		MemoryBudget:   64 << 20,
		MaxInterfaces:  1024,
		ActiveTimeout:  units.Duration(10 * time.Second),
		IdleTimeout:    units.Duration(15 * time.Second),
		SweepInterval:  units.Duration(5 * time.Second),
		PollInterval:   units.Duration(10 * time.Millisecond),
		MeterInterval:  units.Duration(10 * time.Second),
		RescanInterval: units.Duration(30 * time.Second),
		AttachMode:     attach.Auto,
		PinDir:         DefaultPinDir,
	}
}

// Validate reports every invalid field (errors.Join of *units.FieldError).
func (c Config) Validate() error {
	var e units.Errors
	if len(c.Interfaces) == 0 {
		e.Add("interfaces", "is empty", `list at least one glob, e.g. ["tap*"]`)
	}
	for _, g := range c.Interfaces {
		if _, err := path.Match(g, ""); err != nil || g == "" {
			e.Add("interfaces", "bad glob "+quote(g), `use shell globs such as "tap*"`)
		}
	}
	if c.MaxInterfaces < 1 || c.MaxInterfaces > 1<<20 {
		e.Add("max_interfaces", "must be in [1, 1048576]", "use e.g. 1024")
	}
	if c.ActiveTimeout.D() < time.Second {
		e.Add("active_timeout", c.ActiveTimeout.String()+" is below 1s", "use e.g. 10s")
	}
	if c.IdleTimeout.D() < time.Second {
		e.Add("idle_timeout", c.IdleTimeout.String()+" is below 1s", "use e.g. 15s")
	}
	if c.SweepInterval.D() <= 0 || c.SweepInterval.D() > c.IdleTimeout.D() {
		e.Add("sweep_interval", c.SweepInterval.String()+" must be > 0 and ≤ idle_timeout", "use e.g. 5s")
	}
	if c.PollInterval.D() < time.Millisecond || c.PollInterval.D() > time.Second {
		e.Add("poll_interval", c.PollInterval.String()+" must be in [1ms, 1s]", "use e.g. 10ms")
	}
	if c.MeterInterval.D() < 100*time.Millisecond {
		e.Add("meter_interval", c.MeterInterval.String()+" is below 100ms", "use e.g. 10s")
	}
	if c.RescanInterval.D() < 100*time.Millisecond {
		e.Add("rescan_interval", c.RescanInterval.String()+" is below 100ms", "use e.g. 30s")
	}
	if !c.AttachMode.Valid() {
		e.Add("attach_mode", quote(string(c.AttachMode))+" is unknown", "use auto, tcx or tc")
	}
	if c.PinDir != "" && !path.IsAbs(c.PinDir) {
		e.Add("pin_dir", quote(c.PinDir)+" is not an absolute path", `use a directory on bpffs, e.g. "/sys/fs/bpf/tapflow", or "" to disable pinning`)
	}
	if c.FlowTableEntries < 0 {
		e.Add("flow_table_entries", "is negative", "use 0 to derive it from memory_budget")
	}
	if n := c.FlowCacheSlots; n < 0 || n > 1<<16 || n&(n-1) != 0 {
		e.Add("flow_cache_slots", fmt.Sprint(n)+" is not 0 or a power of two ≤ 65536", "use 0 for the default (256)")
	}
	if rs := int64(c.RingBufferSize); rs != 0 && (rs < 4096 || rs&(rs-1) != 0 || rs > 1<<30) {
		e.Add("ring_buffer_size", c.RingBufferSize.String()+" is not a power of two in [4KiB, 1GiB]", "use 0 to derive it, or e.g. 16MiB")
	}
	if n := c.FlowCacheSlots; c.MaxInterfaces >= 1 && c.ActiveTimeout.D() >= time.Second && n >= 0 && n <= 1<<16 && n&(n-1) == 0 {
		if _, err := c.Spec(runtime.NumCPU()); err != nil {
			e.Add("memory_budget", err.Error(), "raise memory_budget or lower max_interfaces or flow_cache_slots")
		}
	}
	return e.Err()
}

// Spec derives the kernel sizes for cpus CPUs.
func (c Config) Spec(cpus int) (bpf.Spec, error) {
	s, err := bpf.SpecFor(int64(c.MemoryBudget), cpus, c.MaxInterfaces, c.ActiveTimeout.D(), uint32(c.FlowCacheSlots))
	if err != nil {
		return bpf.Spec{}, err
	}
	if c.FlowTableEntries > 0 {
		s.FlowEntries = uint32(c.FlowTableEntries)
	}
	if c.RingBufferSize > 0 {
		s.RingBytes = uint32(c.RingBufferSize)
	}
	s.PinDir = c.PinDir
	return s, nil
}

// Match reports whether ifname is to be captured.
func (c Config) Match(ifname string) bool {
	for _, g := range c.Interfaces {
		if ok, _ := path.Match(g, ifname); ok {
			return true
		}
	}
	return false
}

func quote(s string) string { return `"` + s + `"` }
