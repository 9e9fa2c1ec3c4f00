package synthetic

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/internal/units"
)

// Traffic classes: the keys of zone_mix. The first seven are the flow.v1
// zones; lb_segment_1 and lb_segment_2 are Octavia traffic, whose zone is
// the client's location (segment 1: same_tenant, other_tenant or external)
// or infra (segment 2).
const (
	ClassSameTenant  = "same_tenant"
	ClassOtherTenant = "other_tenant"
	ClassShared      = "shared"
	ClassExternal    = "external"
	ClassInfra       = "infra"
	ClassMulticast   = "multicast"
	ClassMiss        = "miss"
	ClassLBSegment1  = "lb_segment_1"
	ClassLBSegment2  = "lb_segment_2"
)

type class uint8

const (
	classSameTenant class = iota
	classOtherTenant
	classShared
	classExternal
	classInfra
	classMulticast
	classMiss
	classLBSegment1
	classLBSegment2
	numClasses
)

// Classes lists the zone_mix keys in generation order.
var Classes = []string{
	ClassSameTenant, ClassOtherTenant, ClassShared, ClassExternal, ClassInfra,
	ClassMulticast, ClassMiss, ClassLBSegment1, ClassLBSegment2,
}

// Limits of the address plan of inventory/synth and of memory.
const (
	MaxTenants          = 32000   // 10.<2·(t/250)+s>.<t%250>.0/24 runs out above
	MaxVMsPerTenant     = 240     // .10–.249; .250–.252 are the VIP and amphorae
	MaxVMs              = 1000000 // tenants × vms_per_tenant: the inventory is built in memory
	MaxExternalNetworks = 100
	MaxFlowsPerSecond   = 1000000 // the active flow table costs ≈ 300 B per flow
	MaxBatchRecords     = 1 << 20
	// UnlimitedRecordsPerFlow is the mean records per flow when
	// records_per_second is 0: the ratio of the defaults.
	UnlimitedRecordsPerFlow = 5
)

// ZoneMix maps a traffic class (see Classes) to its relative weight. In YAML
// a zone_mix replaces the default mix as a whole: classes it leaves out get
// weight 0.
type ZoneMix map[string]float64

// UnmarshalYAML implements yaml.Unmarshaler: it replaces rather than merges
// into the default map.
func (z *ZoneMix) UnmarshalYAML(n *yaml.Node) error {
	m := map[string]float64{}
	if err := n.Decode(&m); err != nil {
		return err
	}
	*z = m
	return nil
}

// Config is the `synthetic:` section of the tapflow config: the generated
// cloud, its traffic and the batching of the source.
type Config struct {
	// Seed makes the stream reproducible: the same seed and config give the
	// same records (timestamps excepted, they follow the clock). Default 1.
	Seed int64 `yaml:"seed"`
	// Tenants is the number of projects in the generated cloud, each with a
	// router and two private /24 networks (1..32000, default 50).
	Tenants int `yaml:"tenants"`
	// VMsPerTenant is the number of VM ports per tenant, alternating over its
	// two networks; VM 0 of each tenant has a floating IP (1..240,
	// default 20; tenants × vms_per_tenant ≤ 1,000,000).
	VMsPerTenant int `yaml:"vms_per_tenant"`
	// LoadBalancers is the number of ACTIVE_STANDBY Octavia load balancers,
	// one in each of the first tenants, members VMs 0, 2 and 4 (0..tenants,
	// default 5).
	LoadBalancers int `yaml:"load_balancers"`
	// ExternalNetworks is the number of external (public) networks the
	// tenants' routers are spread over; external records name theirs
	// (1..100, default 2).
	ExternalNetworks int `yaml:"external_networks"`
	// FlowsPerSecond is the number of distinct flows (capture keys) started
	// per second; it is also the size of the active flow table, visited
	// round robin, so every active flow reports about once a second at the
	// configured record rate (1..1,000,000 flows/s, default 10000). Each flow
	// reports records_per_second / flows_per_second records on average
	// (5 when records_per_second is 0) and its last record ends it.
	FlowsPerSecond int `yaml:"flows_per_second"`
	// RecordsPerSecond caps the record rate (records/s); 0 = as fast as
	// possible, for benchmarks. When set it must be ≥ flows_per_second
	// (default 50000).
	RecordsPerSecond int `yaml:"records_per_second"`
	// BatchRecords is the number of records per batch (1..1048576,
	// default 16384).
	BatchRecords int `yaml:"batch_records"`
	// BatchMaxAge sends a partial batch once its first record is this old
	// (duration ≥ 1ms, default 1s).
	BatchMaxAge units.Duration `yaml:"batch_max_age"`
	// ZoneMix weighs the traffic classes: same_tenant, other_tenant, shared,
	// external, infra, multicast, miss, lb_segment_1, lb_segment_2 (weights
	// ≥ 0, relative, sum > 0; default 30/5/5/35/8/2/2/8/5). A class needs
	// the topology to exist: same_tenant ≥ 2 VMs per tenant, other_tenant
	// ≥ 2 tenants, lb_segment_* ≥ 1 load balancer.
	ZoneMix ZoneMix `yaml:"zone_mix"`
	// Attributed stamps the expected attribution (tenant, zone, peer tenant,
	// external network, load balancer, segment, metadata_version 1) into
	// every record, so the enrich stage can be skipped; otherwise those
	// columns are empty, as from the ebpf source (default false).
	Attributed bool `yaml:"attributed"`
}

// DefaultConfig returns the defaults: 50 tenants × 20 VMs, 5 load
// balancers, 2 external networks, 10,000 flows/s, 50,000 records/s,
// batches of 16384 records or 1 s, the default zone mix, raw records.
func DefaultConfig() Config {
	return Config{
		Seed:             1,
		Tenants:          50,
		VMsPerTenant:     20,
		LoadBalancers:    5,
		ExternalNetworks: 2,
		FlowsPerSecond:   10000,
		RecordsPerSecond: 50000,
		BatchRecords:     16384,
		BatchMaxAge:      units.Duration(time.Second),
		ZoneMix: ZoneMix{
			ClassSameTenant: 30, ClassOtherTenant: 5, ClassShared: 5, ClassExternal: 35, ClassInfra: 8,
			ClassMulticast: 2, ClassMiss: 2, ClassLBSegment1: 8, ClassLBSegment2: 5,
		},
	}
}

// Validate reports every invalid field as a *units.FieldError, joined.
// Paths are relative to the section (the caller prefixes "synthetic").
func (c Config) Validate() error {
	var e units.Errors
	between := func(path string, v, lo, hi int, fix string) bool {
		if v < lo || v > hi {
			e.Add(path, fmt.Sprintf("%d is out of range %d..%d", v, lo, hi), fix)
			return false
		}
		return true
	}
	tenantsOK := between("tenants", c.Tenants, 1, MaxTenants, "use e.g. 50")
	vmsOK := between("vms_per_tenant", c.VMsPerTenant, 1, MaxVMsPerTenant, "use e.g. 20")
	if tenantsOK && vmsOK && c.Tenants*c.VMsPerTenant > MaxVMs {
		e.Add("vms_per_tenant", fmt.Sprintf("tenants × vms_per_tenant = %d exceeds %d VMs", c.Tenants*c.VMsPerTenant, MaxVMs), "lower tenants or vms_per_tenant")
	}
	if c.LoadBalancers < 0 || (tenantsOK && c.LoadBalancers > c.Tenants) {
		e.Add("load_balancers", fmt.Sprintf("%d is out of range 0..tenants (%d)", c.LoadBalancers, c.Tenants), "use at most one per tenant, e.g. 5")
	}
	between("external_networks", c.ExternalNetworks, 1, MaxExternalNetworks, "use e.g. 2")
	flowsOK := between("flows_per_second", c.FlowsPerSecond, 1, MaxFlowsPerSecond, "use e.g. 10000")
	switch {
	case c.RecordsPerSecond < 0:
		e.Add("records_per_second", fmt.Sprintf("%d is negative", c.RecordsPerSecond), "use e.g. 50000, or 0 for as fast as possible")
	case flowsOK && c.RecordsPerSecond > 0 && c.RecordsPerSecond < c.FlowsPerSecond:
		e.Add("records_per_second", fmt.Sprintf("%d is below flows_per_second (%d): every flow needs a record", c.RecordsPerSecond, c.FlowsPerSecond),
			"raise records_per_second or lower flows_per_second")
	}
	between("batch_records", c.BatchRecords, 1, MaxBatchRecords, "use e.g. 16384")
	if c.BatchMaxAge.D() < time.Millisecond {
		e.Add("batch_max_age", fmt.Sprintf("%s is below 1ms", c.BatchMaxAge), "use e.g. 1s")
	}
	c.validateMix(&e, tenantsOK, vmsOK)
	return e.Err()
}

func (c Config) validateMix(e *units.Errors, tenantsOK, vmsOK bool) {
	keys := make([]string, 0, len(c.ZoneMix))
	for k := range c.ZoneMix {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	sum := 0.0
	for _, k := range keys {
		w := c.ZoneMix[k]
		path := "zone_mix." + k
		if !slices.Contains(Classes, k) {
			e.Add(path, fmt.Sprintf("%q is not a traffic class", k), "use "+strings.Join(Classes, ", "))
			continue
		}
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			e.Add(path, fmt.Sprintf("weight %v is not a finite number ≥ 0", w), "use a relative weight such as 10, or 0 to disable")
			continue
		}
		sum += w
		if w == 0 {
			continue
		}
		switch {
		case k == ClassSameTenant && vmsOK && c.VMsPerTenant < 2:
			e.Add(path, "needs at least 2 VMs per tenant", "raise vms_per_tenant or set the weight to 0")
		case k == ClassOtherTenant && tenantsOK && c.Tenants < 2:
			e.Add(path, "needs at least 2 tenants", "raise tenants or set the weight to 0")
		case (k == ClassLBSegment1 || k == ClassLBSegment2) && c.LoadBalancers == 0:
			e.Add(path, "needs at least one load balancer", "raise load_balancers or set the weight to 0")
		}
	}
	if sum <= 0 || math.IsInf(sum, 0) {
		e.Add("zone_mix", "weights sum to 0", "give at least one class a positive weight, e.g. {external: 1}")
	}
}

// weights returns the mix in class order.
func (c Config) weights() [numClasses]float64 {
	var w [numClasses]float64
	for i, name := range Classes {
		w[i] = c.ZoneMix[name]
	}
	return w
}

// recordsPerFlow is the mean number of records a flow reports.
func (c Config) recordsPerFlow() float64 {
	if c.RecordsPerSecond == 0 {
		return UnlimitedRecordsPerFlow
	}
	return max(1, float64(c.RecordsPerSecond)/float64(c.FlowsPerSecond))
}
