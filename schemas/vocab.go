package schemas

// The attribution vocabulary: the zone and direction enums and the sentinel
// strings that records carry. They live here, beside the columns that hold
// them, so every stage (capture, enrich, transport, sinks) speaks them
// without importing enrich.

// Zone is where the far end of a record is, relative to the tenant of the VM
// whose tap saw it. The numeric codes are the domain reference's (§1.1).
type Zone uint8

// Zones.
const (
	ZoneExternal    Zone = 0 // outside the cloud, or reached through an external network
	ZoneSameTenant  Zone = 1 // same project
	ZoneOtherTenant Zone = 2 // another project
	ZoneInfra       Zone = 3 // platform plumbing: DHCP, metadata, gateways, Octavia segment 2
	ZoneMiss        Zone = 4 // cannot be classified: unknown VM MAC
	ZoneShared      Zone = 5 // a shared (non-external) network reached over L3
	ZoneMulticast   Zone = 6 // destination MAC has the group bit set
)

var zoneNames = [...]string{"external", "same_tenant", "other_tenant", "infra", "miss", "shared", "multicast"}

// String is the zone's label in records and metrics.
func (z Zone) String() string {
	if int(z) < len(zoneNames) {
		return zoneNames[z]
	}
	return "miss"
}

// Zones lists every zone, in code order.
var Zones = []Zone{ZoneExternal, ZoneSameTenant, ZoneOtherTenant, ZoneInfra, ZoneMiss, ZoneShared, ZoneMulticast}

// Sentinels written into records.
const (
	// UnknownTenant is tenant_id when the VM-side MAC is not known.
	UnknownTenant = "unknown"
	// NoExternalNetwork is external_network on every non-external record
	// and on external records with no resolvable exit.
	NoExternalNetwork = "none"
)

// lb_tap values: which tap saw a record carrying lb_id. Per-load-balancer
// totals sum the amphora's side only; the member's side is the same
// segment-2 bytes seen again.
const (
	// LBTapAmphora: the tap of the load balancer's amphora (segment 1,
	// segment 2 and anything else its data ports carry).
	LBTapAmphora = "amphora"
	// LBTapMember: a pool member's tap, on its segment-2 records.
	LBTapMember = "member"
)

// Direction is the record's direction from the VM's point of view.
type Direction uint8

// Directions. The zero value is invalid on purpose: a record without a
// direction is attributed as miss.
const (
	DirInvalid Direction = iota
	DirTX                // the VM sends: tap ingress hook
	DirRX                // the VM receives: tap egress hook
)

// ParseDirection reads "tx" or "rx".
func ParseDirection(s string) Direction {
	switch s {
	case "tx":
		return DirTX
	case "rx":
		return DirRX
	}
	return DirInvalid
}

// String is "tx", "rx" or "invalid".
func (d Direction) String() string {
	switch d {
	case DirTX:
		return "tx"
	case DirRX:
		return "rx"
	}
	return "invalid"
}
