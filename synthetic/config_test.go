package synthetic

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/internal/units"
)

func fieldPaths(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var paths []string
	for _, e := range errs {
		var fe *units.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v is not a *units.FieldError", e)
		}
		if fe.Fix == "" {
			t.Errorf("%s: no fix given", fe.Path)
		}
		paths = append(paths, fe.Path)
	}
	return paths
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(c *Config)
		paths []string
	}{
		{"defaults", func(*Config) {}, nil},
		{"largest cloud", func(c *Config) { c.Tenants, c.VMsPerTenant, c.LoadBalancers = 4000, 240, 4000 }, nil},
		{"unlimited rate", func(c *Config) { c.RecordsPerSecond = 0 }, nil},
		{"no tenants", func(c *Config) { c.Tenants = 0 }, []string{"tenants"}},
		{"too many tenants", func(c *Config) { c.Tenants = MaxTenants + 1 }, []string{"tenants"}},
		{"too many VMs per tenant", func(c *Config) { c.VMsPerTenant = 241 }, []string{"vms_per_tenant"}},
		{"too many VMs", func(c *Config) { c.Tenants, c.VMsPerTenant = 5000, 201 }, []string{"vms_per_tenant"}},
		{"more LBs than tenants", func(c *Config) { c.LoadBalancers = 51 }, []string{"load_balancers"}},
		{"negative LBs", func(c *Config) { c.LoadBalancers = -1 }, []string{"load_balancers"}},
		{"no external network", func(c *Config) { c.ExternalNetworks = 0 }, []string{"external_networks"}},
		{"no flows", func(c *Config) { c.FlowsPerSecond = 0 }, []string{"flows_per_second"}},
		{"too many flows", func(c *Config) { c.FlowsPerSecond, c.RecordsPerSecond = MaxFlowsPerSecond+1, 0 }, []string{"flows_per_second"}},
		{"negative rate", func(c *Config) { c.RecordsPerSecond = -1 }, []string{"records_per_second"}},
		{"rate below flows", func(c *Config) { c.RecordsPerSecond = 9999 }, []string{"records_per_second"}},
		{"empty batch", func(c *Config) { c.BatchRecords = 0 }, []string{"batch_records"}},
		{"huge batch", func(c *Config) { c.BatchRecords = MaxBatchRecords + 1 }, []string{"batch_records"}},
		{"no batch age", func(c *Config) { c.BatchMaxAge = 0 }, []string{"batch_max_age"}},
		{"unknown class", func(c *Config) { c.ZoneMix["externel"] = 1 }, []string{"zone_mix.externel"}},
		{"negative weight", func(c *Config) { c.ZoneMix[ClassShared] = -1 }, []string{"zone_mix.shared"}},
		{"NaN weight", func(c *Config) { c.ZoneMix[ClassShared] = math.NaN() }, []string{"zone_mix.shared"}},
		{"all zero", func(c *Config) { c.ZoneMix = ZoneMix{ClassExternal: 0} }, []string{"zone_mix"}},
		{"empty mix", func(c *Config) { c.ZoneMix = nil }, []string{"zone_mix"}},
		{"same_tenant needs 2 VMs", func(c *Config) { c.VMsPerTenant = 1 }, []string{"zone_mix.same_tenant"}},
		{"same_tenant off with 1 VM", func(c *Config) { c.VMsPerTenant, c.ZoneMix[ClassSameTenant] = 1, 0 }, nil},
		{"other_tenant needs 2 tenants", func(c *Config) { c.Tenants, c.LoadBalancers = 1, 1 }, []string{"zone_mix.other_tenant"}},
		{"LB classes need an LB", func(c *Config) { c.LoadBalancers = 0 }, []string{"zone_mix.lb_segment_1", "zone_mix.lb_segment_2"}},
		{"all at once", func(c *Config) { c.Tenants, c.BatchRecords, c.ZoneMix["x"] = -1, 0, 1 },
			[]string{"tenants", "batch_records", "zone_mix.x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			c.edit(&cfg)
			got := fieldPaths(t, cfg.Validate())
			if !slices.Equal(got, c.paths) {
				t.Errorf("paths %v, want %v (%v)", got, c.paths, cfg.Validate())
			}
		})
	}
}

func TestDefaultConfigIsIndependent(t *testing.T) {
	a := DefaultConfig()
	a.ZoneMix[ClassExternal] = 99
	if DefaultConfig().ZoneMix[ClassExternal] == 99 {
		t.Fatal("DefaultConfig shares its zone mix between calls")
	}
}

func TestConfigYAML(t *testing.T) {
	const doc = `
seed: 7
tenants: 3
load_balancers: 2
records_per_second: 0
batch_max_age: 250ms
zone_mix: {external: 3, miss: 1}
attributed: true
`
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := ZoneMix{ClassExternal: 3, ClassMiss: 1} // replaces the default mix, does not merge
	if len(cfg.ZoneMix) != len(want) || cfg.ZoneMix[ClassExternal] != 3 || cfg.ZoneMix[ClassMiss] != 1 {
		t.Errorf("zone_mix = %v, want %v", cfg.ZoneMix, want)
	}
	if cfg.Seed != 7 || cfg.Tenants != 3 || cfg.RecordsPerSecond != 0 || cfg.BatchMaxAge.D() != 250*time.Millisecond ||
		!cfg.Attributed || cfg.VMsPerTenant != DefaultConfig().VMsPerTenant {
		t.Errorf("decoded %+v", cfg)
	}
	bad := DefaultConfig()
	if err := yaml.Unmarshal([]byte("zone_mix: {external: lots}"), &bad); err == nil {
		t.Error("a non-numeric weight decoded")
	}
}
