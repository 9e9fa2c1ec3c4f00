package snapshot

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// Anomaly classes (tapflow_attribution_anomalies_total{class}).
const (
	AnomalyInvalidMAC         = "invalid_mac"          // port or address pair MAC does not parse: not admitted
	AnomalyInvalidCIDR        = "invalid_cidr"         // subnet CIDR or route destination does not parse: skipped
	AnomalyInvalidIP          = "invalid_ip"           // fixed IP, gateway, next hop, VIP or amphora address does not parse: that address skipped
	AnomalyUnknownNetwork     = "unknown_network"      // subnet on a network not in the inventory: skipped; port: admitted anyway
	AnomalyMissingProject     = "missing_project"      // VM-like port without project: not admitted
	AnomalyDuplicateMAC       = "duplicate_mac"        // several ports claim one MAC: one tenant keeps it, several tenants drop it
	AnomalyDuplicateRouterMAC = "duplicate_router_mac" // router interfaces of different exits share a MAC: dropped from the router map
	AnomalyCycle              = "cycle"                // extraroute trace revisited a router: external
	AnomalyAmbiguity          = "ambiguity"            // extraroute trace found several owners: external
	AnomalyMaxHops            = "max_hops"             // extraroute trace exceeded the hop limit: external
	AnomalyDanglingRoute      = "dangling_route"       // extraroute next hop matches no port: external
	AnomalyMultiExternalPath  = "multi_external_path"  // port has several exits in one tier: smallest label wins
	AnomalyOctaviaSkipped     = "octavia_skipped"      // load balancer or amphora not usable for the join (provider, missing data)
	AnomalyTrunkSkipped       = "trunk_skipped"        // trunk subport not attributed by VLAN (unknown parent or port, inherit segmentation, VLAN claimed twice)
)

// Anomaly is one inventory object the builder skipped or resolved by a safe
// rule.
type Anomaly struct {
	Class  string // one of the Anomaly* constants
	Kind   string // object kind: port, subnet, router, ...
	ID     string // object id
	Detail string
}

func (a Anomaly) String() string { return a.Class + " " + a.Kind + " " + a.ID + ": " + a.Detail }

// Endpoint is what a VM-like MAC resolves to. It is immutable once built.
type Endpoint struct {
	TenantID  string // project billed: the port's, or the load balancer owner's for amphora data ports
	ServerID  string // port device_id
	PortID    string
	NetworkID string
	// ExternalNetwork is the per-port fallback exit label (floating IP
	// network, else the gateway of the router holding the subnet gateway),
	// "" when the port has none.
	ExternalNetwork string
	LBID            string // load balancer, for amphora data ports
	Amphora         bool
	AAP             bool  // admitted through an allowed-address pair
	DeleteAtUS      int64 // 0 while the port exists; else when the ghost expires (µs)

	tenant uint32
	// domain indexes the rows reachable from the port's subnets (its own
	// subnets and every subnet and route of the routers attached to them);
	// domainKey names it across builds (ghosts).
	domain    uint32
	domainKey string
	lb        *lbAddrs // amphora data ports only: one pointer, not two slices, per endpoint
}

// lbAddrs are an amphora data port's addresses.
type lbAddrs struct {
	base []netip.Addr // the port's fixed IPs (segment 2 side)
	vips []netip.Addr // the load balancer's VIPs (segment 1 side)
}

// base is an amphora data port's fixed IPs, nil for other endpoints.
func (e *Endpoint) base() []netip.Addr {
	if e.lb == nil {
		return nil
	}
	return e.lb.base
}

// vips is the load balancer's VIPs for an amphora data port, else nil.
func (e *Endpoint) vips() []netip.Addr {
	if e.lb == nil {
		return nil
	}
	return e.lb.vips
}

// tapKey is a tap name's port id part (tap<port-id[:11]>), kept inline:
// a string key would cost an allocation per port.
type tapKey struct {
	id [11]byte
	n  uint8
}

// tapKeyOf is the key of tap name t; false when t cannot be a tap name of
// the form Nova uses.
func tapKeyOf(t string) (tapKey, bool) {
	var k tapKey
	if len(t) < 3 || len(t) > 3+len(k.id) || t[:3] != "tap" {
		return k, false
	}
	k.n = uint8(copy(k.id[:], t[3:]))
	return k, true
}

func (k tapKey) String() string { return "tap" + string(k.id[:k.n]) }

// Options control Build.
type Options struct {
	Version int64     // stamped into every Result as metadata_version
	Now     time.Time // build time; ghost deadlines are Now + GhostGrace
	// GhostGrace is how long a MAC that left the inventory keeps
	// attributing. 0 disables ghosts.
	GhostGrace time.Duration
	// MaxRouteHops bounds the extraroute trace; 0 means 16.
	MaxRouteHops int
	// Prev is the snapshot this one replaces: its endpoints that are gone
	// become ghosts, its ghosts keep their deadline.
	Prev *Snapshot
}

// Stats describe a built snapshot.
type Stats struct {
	Endpoints   int // live VM-like MACs
	Ghosts      int // MACs kept for the grace window
	AmphoraMACs int // amphora data port MACs re-attributed to a load balancer owner
	RouterMACs  int // gatewayed router interface MACs
	Tenants     int
	Rows4       int // prefix rows, all tables
	Rows6       int
}

// Snapshot is an immutable attribution index. Safe for concurrent use.
type Snapshot struct {
	version int64
	built   time.Time
	// macs holds VM-like endpoints and gatewayed router interfaces; the
	// entry is inline so the ghost check, tenant comparison and router
	// label need no pointer chase.
	macs      map[uint64]macEntry
	taps      map[tapKey]uint64 // tap<port-id[:11]> → the port's MAC (received multicast)
	labels    []string          // router exit labels, by macEntry.label
	tenants   []string          // project by tenant index; 0 is ""
	tables    []tables          // 0: global rows; i: tenant i
	domains   []tables          // 0: none; i: rows reachable from one set of subnets
	members   map[memberKey][]memberRef
	vlans     map[vlanKey]macEntry // trunk subports by (MAC on the wire, VLAN)
	domainIdx map[string]uint32
	vals      []rowVal
	tenantIdx map[string]uint32
	anomalies []Anomaly
	stats     Stats
}

// vlanKey finds a trunk subport: its MAC (by default its parent's) and
// its segmentation id.
type vlanKey struct {
	mac  uint64
	vlan uint16
}

// memberKey finds pool members: (load balancer, member address).
type memberKey struct {
	lb   string
	addr netip.Addr
}

type memberRef struct {
	pool, member string
	port         uint16
}

type macEntry struct {
	ep       *Endpoint // nil: router interface only
	deleteAt int64     // ep's ghost deadline (µs), 0 while live
	tenant   uint32
	domain   uint32
	amphora  bool
	label    int32 // router exit label index, -1: not a gatewayed router MAC
}

type tables struct {
	v4 lpm4
	v6 lpm6
}

type rowVal struct {
	zone schemas.Zone
	peer string // peer tenant for same/other rows
	bits uint8  // prefix length, set when the tables are flattened
}

// Version is the snapshot's metadata_version.
func (s *Snapshot) Version() int64 { return s.version }

// Built is when the snapshot was built.
func (s *Snapshot) Built() time.Time { return s.built }

// Anomalies lists what the builder skipped or resolved, sorted.
func (s *Snapshot) Anomalies() []Anomaly { return s.anomalies }

// Stats describes the snapshot.
func (s *Snapshot) Stats() Stats { return s.stats }

// Endpoint returns the endpoint a MAC resolves to at nowUS (ghosts
// included), for inspection and tests.
func (s *Snapshot) Endpoint(mac uint64, nowUS int64) (*Endpoint, bool) {
	e, ok := s.lookupMAC(mac, nowUS)
	return e.ep, ok
}

// Device owners.
const (
	ownerRouterInterface     = "network:router_interface"
	ownerRouterInterfaceDist = "network:router_interface_distributed"
	ownerRouterInterfaceHA   = "network:ha_router_replicated_interface"
	ownerFloatingIP          = "network:floatingip"
)

// IsInfraPort: any network:* owner except network:floatingip (§1.6).
func IsInfraPort(owner string) bool {
	return strings.HasPrefix(owner, "network:") && owner != ownerFloatingIP
}

// IsVMPort: any non-empty owner outside network:* (§1.6).
func IsVMPort(owner string) bool { return owner != "" && !strings.HasPrefix(owner, "network:") }

func isRouterInterface(owner string) bool {
	return owner == ownerRouterInterface || owner == ownerRouterInterfaceDist || owner == ownerRouterInterfaceHA
}

// MetadataV4 and MetadataV6 are the instance metadata service addresses,
// always infra.
var (
	MetadataV4 = netip.MustParseAddr("169.254.169.254")
	MetadataV6 = netip.MustParseAddr("fe80::a9fe:a9fe")
)

type subnetInfo struct {
	s      *inventory.Subnet
	prefix netip.Prefix
	gw     netip.Addr // invalid when none
	net    *inventory.Network
}

type iface struct {
	sub *subnetInfo
	ip  netip.Addr
	mac uint64
}

type routerInfo struct {
	r      *inventory.Router
	ifaces []iface
	label  string // exit label, "" when no gateway
}

type builder struct {
	slab       []Endpoint // newEndpoint's current chunk
	inv        *inventory.Inventory
	opt        Options
	anomalies  []Anomaly
	networks   map[string]*inventory.Network
	subnets    map[string]*subnetInfo
	portsByIP  map[subnetAddr]*inventory.Port
	routers    map[string]*routerInfo
	tenantIdx  map[string]uint32
	tenants    []string
	rows       map[uint32]map[netip.Prefix]rowVal // tenant 0: global
	fipLabels  map[string][]string                // port id → labels of its floating IP networks
	portIPs    map[string][]netip.Addr            // port id → parsed fixed IPs
	portSubs   map[string][]*subnetInfo           // port id → subnets of its fixed IPs
	subRouters map[*subnetInfo][]*routerInfo      // routers with an interface on the subnet, by id
	routerMAC  map[uint64]string                  // gatewayed router interface MAC → exit label
	portTenant map[string]string                  // admitted VM-like port → tenant billed (LB owner for amphorae)
	domainIdx  map[string]uint32                  // sorted subnet ids → domain
	drows      []map[netip.Prefix]rowVal          // domain rows; 0 unused
	downers    []map[string]bool                  // per domain: the owners of its other_tenant rows
	subRows    map[*subnetInfo][]prow             // cache of subnetRows
	rtRows     map[*routerInfo][]prow             // cache of router route rows, owner-relative
	subPorts   map[string][]*inventory.Port       // subnet id → ports with a fixed IP on it
	vlanEPs    map[vlanKey]*Endpoint              // trunk subports
}

// newEndpoint returns a zero Endpoint from a chunk of many: one
// allocation per chunk, not a small one per port amid the builder's
// garbage (which kept half-empty pages in use after the build).
func (b *builder) newEndpoint() *Endpoint {
	if len(b.slab) == cap(b.slab) {
		b.slab = make([]Endpoint, 0, 1024)
	}
	b.slab = b.slab[:len(b.slab)+1]
	return &b.slab[len(b.slab)-1]
}

// prow is a prefix row before it is put into a table.
type prow struct {
	p netip.Prefix
	v rowVal
}

type subnetAddr struct {
	subnet string
	ip     netip.Addr
}

func (b *builder) anomaly(class, kind, id, format string, args ...any) {
	b.anomalies = append(b.anomalies, Anomaly{Class: class, Kind: kind, ID: id, Detail: fmt.Sprintf(format, args...)})
}

func (b *builder) intern(project string) uint32 {
	if i, ok := b.tenantIdx[project]; ok {
		return i
	}
	b.tenants = append(b.tenants, project)
	i := uint32(len(b.tenants)) // 0 is the global table
	b.tenantIdx[project] = i
	return i
}

// zoneRank breaks ties between two rows with the same prefix in one table:
// the more specific meaning wins.
func zoneRank(z schemas.Zone) int {
	switch z {
	case schemas.ZoneInfra:
		return 5
	case schemas.ZoneSameTenant:
		return 4
	case schemas.ZoneShared:
		return 3
	case schemas.ZoneOtherTenant:
		return 2
	}
	return 1
}

func (b *builder) addRow(tenant uint32, p netip.Prefix, v rowVal) {
	m := b.rows[tenant]
	if m == nil {
		m = map[netip.Prefix]rowVal{}
		b.rows[tenant] = m
	}
	putRow(m, p, v)
}

func putRow(m map[netip.Prefix]rowVal, p netip.Prefix, v rowVal) {
	p = p.Masked()
	if old, ok := m[p]; ok {
		if zoneRank(old.zone) > zoneRank(v.zone) || (zoneRank(old.zone) == zoneRank(v.zone) && old.peer <= v.peer) {
			return
		}
	}
	m[p] = v
}

func netLabel(n *inventory.Network, id string) string {
	if n != nil && n.Name != "" {
		return n.Name
	}
	return id
}

func parseAddr(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// Build indexes inv. It never fails: unusable objects become anomalies.
func Build(inv *inventory.Inventory, opt Options) *Snapshot {
	if inv == nil {
		inv = &inventory.Inventory{}
	}
	if opt.MaxRouteHops <= 0 {
		opt.MaxRouteHops = 16
	}
	if opt.Now.IsZero() {
		opt.Now = time.Now()
	}
	b := &builder{
		inv: inv, opt: opt,
		networks:   map[string]*inventory.Network{},
		subnets:    map[string]*subnetInfo{},
		portsByIP:  map[subnetAddr]*inventory.Port{},
		routers:    map[string]*routerInfo{},
		tenantIdx:  map[string]uint32{},
		rows:       map[uint32]map[netip.Prefix]rowVal{},
		fipLabels:  map[string][]string{},
		portIPs:    map[string][]netip.Addr{},
		portSubs:   map[string][]*subnetInfo{},
		portTenant: map[string]string{},
		domainIdx:  map[string]uint32{},
		drows:      []map[netip.Prefix]rowVal{nil},
		downers:    []map[string]bool{nil},
		subRows:    map[*subnetInfo][]prow{},
		rtRows:     map[*routerInfo][]prow{},
	}
	b.indexNetworks()
	b.indexPorts()
	b.indexRouters()
	b.indexFloatingIPs()
	b.routerMAC = b.routerMACs()
	s := &Snapshot{version: opt.Version, built: opt.Now, tenantIdx: b.tenantIdx}
	eps := b.endpoints(&s.stats)
	b.prefixRows()
	b.routeRows()
	b.domainRows(eps)
	s.tables, s.domains, s.vals = b.flattenTables(&s.stats)
	s.domainIdx = b.domainIdx
	b.carryGhosts(s, eps)
	s.members = b.members()
	s.vlans = make(map[vlanKey]macEntry, len(b.vlanEPs))
	for k, e := range b.vlanEPs {
		if e == nil {
			continue // claimed twice: anomaly
		}
		s.vlans[k] = macEntry{ep: e, tenant: e.tenant, domain: e.domain, amphora: e.Amphora, label: -1}
	}
	s.macs = make(map[uint64]macEntry, len(eps)+len(b.routerMAC))
	s.taps = make(map[tapKey]uint64, len(eps))
	for mac, e := range eps {
		s.macs[mac] = macEntry{ep: e, deleteAt: e.DeleteAtUS, tenant: e.tenant, domain: e.domain, amphora: e.Amphora, label: -1}
		if !e.AAP && e.PortID != "" {
			if k, ok := tapKeyOf("tap" + e.PortID[:min(11, len(e.PortID))]); ok {
				s.taps[k] = mac
			}
		}
	}
	labelIdx := map[string]int32{}
	for mac, l := range b.routerMAC {
		i, ok := labelIdx[l]
		if !ok {
			i = int32(len(s.labels))
			s.labels = append(s.labels, l)
			labelIdx[l] = i
		}
		e := s.macs[mac] // a router MAC that is also an endpoint keeps both roles
		e.label = i
		s.macs[mac] = e
	}
	s.tenants = append([]string{""}, b.tenants...)
	s.stats.RouterMACs = len(b.routerMAC)
	s.stats.Tenants = len(b.tenants)
	slices.SortFunc(b.anomalies, func(x, y Anomaly) int {
		return cmp.Or(cmp.Compare(x.Class, y.Class), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.ID, y.ID), cmp.Compare(x.Detail, y.Detail))
	})
	s.anomalies = slices.CompactFunc(b.anomalies, func(x, y Anomaly) bool { return x == y })
	return s
}

func (b *builder) indexNetworks() {
	for i := range b.inv.Networks {
		n := &b.inv.Networks[i]
		b.networks[n.ID] = n
	}
	for i := range b.inv.Subnets {
		sn := &b.inv.Subnets[i]
		p, err := netip.ParsePrefix(strings.TrimSpace(sn.CIDR))
		if err != nil || p.Addr().Zone() != "" {
			b.anomaly(AnomalyInvalidCIDR, "subnet", sn.ID, "cidr %q does not parse", sn.CIDR)
			continue
		}
		n := b.networks[sn.NetworkID]
		if n == nil {
			b.anomaly(AnomalyUnknownNetwork, "subnet", sn.ID, "network_id %q is not in the inventory", sn.NetworkID)
			continue
		}
		si := &subnetInfo{s: sn, prefix: p.Masked(), net: n}
		if sn.GatewayIP != "" {
			if gw, ok := parseAddr(sn.GatewayIP); ok && gw.Is4() == p.Addr().Is4() {
				si.gw = gw
			} else {
				b.anomaly(AnomalyInvalidIP, "subnet", sn.ID, "gateway_ip %q does not parse or is not in the subnet's family", sn.GatewayIP)
			}
		}
		b.subnets[sn.ID] = si
	}
}

func (b *builder) indexPorts() {
	for i := range b.inv.Ports {
		p := &b.inv.Ports[i]
		for _, f := range p.FixedIPs {
			a, ok := parseAddr(f.IPAddress)
			if !ok {
				b.anomaly(AnomalyInvalidIP, "port", p.ID, "fixed_ips ip_address %q does not parse", f.IPAddress)
				continue
			}
			b.portIPs[p.ID] = append(b.portIPs[p.ID], a)
			if si := b.subnets[f.SubnetID]; si != nil {
				b.portSubs[p.ID] = append(b.portSubs[p.ID], si)
				b.portsByIP[subnetAddr{f.SubnetID, a}] = p
			}
		}
	}
}

func (b *builder) indexRouters() {
	for i := range b.inv.Routers {
		r := &b.inv.Routers[i]
		ri := &routerInfo{r: r}
		if gw := r.GatewayNetworkID(); gw != "" {
			ri.label = netLabel(b.networks[gw], gw)
		}
		b.routers[r.ID] = ri
	}
	for i := range b.inv.Ports {
		p := &b.inv.Ports[i]
		if !isRouterInterface(p.DeviceOwner) {
			continue
		}
		ri := b.routers[p.DeviceID]
		if ri == nil {
			continue
		}
		mac, macOK := ParseMAC(p.MACAddress)
		if !macOK {
			b.anomaly(AnomalyInvalidMAC, "port", p.ID, "mac_address %q does not parse", p.MACAddress)
		}
		for _, f := range p.FixedIPs {
			si := b.subnets[f.SubnetID]
			a, ok := parseAddr(f.IPAddress)
			if si == nil || !ok {
				continue
			}
			ri.ifaces = append(ri.ifaces, iface{sub: si, ip: a, mac: mac})
		}
	}
}

func (b *builder) indexFloatingIPs() {
	for i := range b.inv.FloatingIPs {
		f := &b.inv.FloatingIPs[i]
		if f.PortID == "" || f.FloatingNetworkID == "" {
			continue
		}
		b.fipLabels[f.PortID] = append(b.fipLabels[f.PortID], netLabel(b.networks[f.FloatingNetworkID], f.FloatingNetworkID))
	}
}

// routerMACs maps every gatewayed router interface MAC to its exit label
// (§1.11 rule 1). A MAC claimed by routers with different exits is dropped.
func (b *builder) routerMACs() map[uint64]string {
	m := map[uint64]string{}
	bad := map[uint64]bool{}
	ids := make([]string, 0, len(b.routers))
	for id := range b.routers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	owner := map[uint64]string{}
	for _, id := range ids {
		ri := b.routers[id]
		for _, f := range ri.ifaces {
			if f.mac == 0 {
				continue
			}
			if prev, ok := owner[f.mac]; ok && prev != id {
				if m[f.mac] != ri.label {
					bad[f.mac] = true
				}
				b.anomaly(AnomalyDuplicateRouterMAC, "router", id, "interface MAC %s also on router %s", FormatMAC(f.mac), prev)
				continue
			}
			owner[f.mac] = id
			if ri.label != "" {
				m[f.mac] = ri.label
			}
		}
	}
	for mac := range bad {
		delete(m, mac)
	}
	return m
}

// externalFallback is the per-port exit label (§1.11 rule 2): a floating IP
// network first, then the gateway of the router holding the subnet gateway,
// then any other gatewayed router on the port's subnets. Several candidates
// in a tier: the smallest label, and an anomaly.
func (b *builder) externalFallback(p *inventory.Port, extraFIPPorts ...string) string {
	var fips []string
	fips = append(fips, b.fipLabels[p.ID]...)
	for _, id := range extraFIPPorts {
		fips = append(fips, b.fipLabels[id]...)
	}
	if l := b.pick(p, fips); l != "" {
		return l
	}
	var gwOwners, others []string
	for _, si := range b.portSubs[p.ID] {
		for _, ri := range b.attached(si) {
			if ri.label == "" {
				continue
			}
			holdsGW := false
			for _, f := range ri.ifaces {
				if f.sub == si && si.gw.IsValid() && f.ip == si.gw {
					holdsGW = true
				}
			}
			if holdsGW {
				gwOwners = append(gwOwners, ri.label)
			} else {
				others = append(others, ri.label)
			}
		}
	}
	if l := b.pick(p, gwOwners); l != "" {
		return l
	}
	return b.pick(p, others)
}

func (b *builder) pick(p *inventory.Port, labels []string) string {
	if len(labels) == 0 {
		return ""
	}
	slices.Sort(labels)
	labels = slices.Compact(labels)
	if len(labels) > 1 {
		b.anomaly(AnomalyMultiExternalPath, "port", p.ID, "exits %s; using %s", strings.Join(labels, ","), labels[0])
	}
	return labels[0]
}

// attached lists the routers with an interface on si, by id.
func (b *builder) attached(si *subnetInfo) []*routerInfo {
	if b.subRouters == nil {
		b.subRouters = map[*subnetInfo][]*routerInfo{}
		for _, ri := range b.routers {
			for _, f := range ri.ifaces {
				if l := b.subRouters[f.sub]; len(l) == 0 || l[len(l)-1] != ri {
					b.subRouters[f.sub] = append(l, ri)
				}
			}
		}
		for _, l := range b.subRouters {
			slices.SortFunc(l, func(x, y *routerInfo) int { return cmp.Compare(x.r.ID, y.r.ID) })
			l = slices.Compact(l)
		}
	}
	return b.subRouters[si]
}

type amphoraPort struct {
	lb   *inventory.LoadBalancer
	vips []netip.Addr
}

// amphoraPorts joins amphorae to ports on compute_id = device_id, excluding
// the management port (the one holding lb_network_ip), §2.3.
func (b *builder) amphoraPorts() map[string]amphoraPort {
	lbs := map[string]*inventory.LoadBalancer{}
	for i := range b.inv.LoadBalancers {
		lb := &b.inv.LoadBalancers[i]
		switch strings.ToLower(lb.Provider) {
		case "", "amphora", "octavia":
		default:
			b.anomaly(AnomalyOctaviaSkipped, "loadbalancer", lb.ID, "provider %q is not amphora: billed as if Octavia did not exist", lb.Provider)
			continue
		}
		if lb.Project() == "" {
			b.anomaly(AnomalyOctaviaSkipped, "loadbalancer", lb.ID, "no project_id")
			continue
		}
		lbs[lb.ID] = lb
	}
	byDevice := map[string][]*inventory.Port{}
	for i := range b.inv.Ports {
		p := &b.inv.Ports[i]
		if p.DeviceID != "" && IsVMPort(p.DeviceOwner) {
			byDevice[p.DeviceID] = append(byDevice[p.DeviceID], p)
		}
	}
	out := map[string]amphoraPort{}
	for i := range b.inv.Amphorae {
		a := &b.inv.Amphorae[i]
		if strings.EqualFold(a.Status, "DELETED") {
			continue
		}
		lb := lbs[a.LoadBalancerID]
		if lb == nil {
			if a.LoadBalancerID != "" {
				b.anomaly(AnomalyOctaviaSkipped, "amphora", a.ID, "loadbalancer_id %q is not a usable load balancer", a.LoadBalancerID)
			}
			continue
		}
		if a.ComputeID == "" {
			b.anomaly(AnomalyOctaviaSkipped, "amphora", a.ID, "no compute_id yet (booting)")
			continue
		}
		var mgmt netip.Addr
		if a.LBNetworkIP != "" {
			var ok bool
			if mgmt, ok = parseAddr(a.LBNetworkIP); !ok {
				b.anomaly(AnomalyInvalidIP, "amphora", a.ID, "lb_network_ip %q does not parse", a.LBNetworkIP)
			}
		}
		var vips []netip.Addr
		if v, ok := parseAddr(lb.VIPAddress); ok {
			vips = append(vips, v)
		} else if lb.VIPAddress != "" {
			b.anomaly(AnomalyInvalidIP, "loadbalancer", lb.ID, "vip_address %q does not parse", lb.VIPAddress)
		}
	ports:
		for _, p := range byDevice[a.ComputeID] {
			if mgmt.IsValid() {
				for _, ip := range b.portIPs[p.ID] {
					if ip == mgmt {
						continue ports // management port: stays with the service project
					}
				}
			}
			out[p.ID] = amphoraPort{lb: lb, vips: vips}
		}
	}
	return out
}

// members indexes pool members by (load balancer, address) for the
// per-member columns of segment 2. A member whose address does not parse
// is an invalid_ip anomaly.
func (b *builder) members() map[memberKey][]memberRef {
	out := map[memberKey][]memberRef{}
	for i := range b.inv.Pools {
		p := &b.inv.Pools[i]
		for _, m := range p.Members {
			a, ok := parseAddr(m.Address)
			if !ok {
				b.anomaly(AnomalyInvalidIP, "member", m.ID, "address %q does not parse", m.Address)
				continue
			}
			for _, lb := range p.LoadBalancers {
				k := memberKey{lb.ID, a}
				out[k] = append(out[k], memberRef{pool: p.ID, member: m.ID, port: uint16(m.ProtocolPort)})
			}
		}
	}
	for _, l := range out {
		slices.SortFunc(l, func(x, y memberRef) int { return cmp.Or(cmp.Compare(x.pool, y.pool), cmp.Compare(x.member, y.member)) })
	}
	return out
}

type subport struct {
	vlan      uint16
	parentMAC uint64
}

// trunkSubports maps subport port ids to their VLAN and the parent port's
// MAC. A subport whose trunk, parent or segmentation cannot be used is an
// anomaly and has VLAN 0: it is not found by VLAN, and when it shares the
// parent's MAC it never claims it (its frames are tagged; untagged ones
// are the parent's).
func (b *builder) trunkSubports() map[string]subport {
	if len(b.inv.Trunks) == 0 {
		return nil
	}
	ports := make(map[string]*inventory.Port, len(b.inv.Ports))
	for i := range b.inv.Ports {
		ports[b.inv.Ports[i].ID] = &b.inv.Ports[i]
	}
	out := map[string]subport{}
	for i := range b.inv.Trunks {
		tr := &b.inv.Trunks[i]
		parent := ports[tr.PortID]
		pm, ok := uint64(0), false
		if parent != nil {
			pm, ok = ParseMAC(parent.MACAddress)
		}
		for _, sp := range tr.SubPorts {
			switch {
			case !ok:
				b.anomaly(AnomalyTrunkSkipped, "trunk", tr.ID, "parent port %q is not in the inventory (or its MAC does not parse): subport %s attributed by MAC only", tr.PortID, sp.PortID)
			case ports[sp.PortID] == nil:
				b.anomaly(AnomalyTrunkSkipped, "trunk", tr.ID, "subport %q is not in the inventory", sp.PortID)
			case sp.SegmentationType != "" && sp.SegmentationType != "vlan":
				b.anomaly(AnomalyTrunkSkipped, "trunk", tr.ID, "subport %s: segmentation_type %q: only vlan is attributed", sp.PortID, sp.SegmentationType)
				out[sp.PortID] = subport{parentMAC: pm}
			case sp.SegmentationID < 1 || sp.SegmentationID > 4094:
				b.anomaly(AnomalyTrunkSkipped, "trunk", tr.ID, "subport %s: segmentation_id %d is not a VLAN id", sp.PortID, sp.SegmentationID)
				out[sp.PortID] = subport{parentMAC: pm}
			default:
				out[sp.PortID] = subport{vlan: uint16(sp.SegmentationID), parentMAC: pm}
			}
		}
	}
	return out
}

type claim struct {
	e       *Endpoint
	primary bool // the port's own MAC, not an address pair
}

// endpoints admits VM-like ports (§1.6) and their allowed-address-pair
// MACs, with amphora data ports re-attributed to the LB owner.
func (b *builder) endpoints(st *Stats) map[uint64]*Endpoint {
	amph := b.amphoraPorts()
	subs := b.trunkSubports()
	b.vlanEPs = map[vlanKey]*Endpoint{}
	claims := map[uint64][]claim{}
	for i := range b.inv.Ports {
		p := &b.inv.Ports[i]
		if !IsVMPort(p.DeviceOwner) {
			continue
		}
		mac, ok := ParseMAC(p.MACAddress)
		if !ok {
			b.anomaly(AnomalyInvalidMAC, "port", p.ID, "mac_address %q does not parse", p.MACAddress)
			continue
		}
		if p.Project() == "" {
			b.anomaly(AnomalyMissingProject, "port", p.ID, "no project_id: not admitted")
			continue
		}
		if _, ok := b.networks[p.NetworkID]; !ok {
			b.anomaly(AnomalyUnknownNetwork, "port", p.ID, "network_id %q is not in the inventory; admitted anyway", p.NetworkID)
		}
		e := b.newEndpoint()
		*e = Endpoint{TenantID: p.Project(), ServerID: p.DeviceID, PortID: p.ID, NetworkID: p.NetworkID}
		if a, ok := amph[p.ID]; ok {
			e.TenantID, e.LBID, e.Amphora = a.lb.Project(), a.lb.ID, true
			if base := b.portIPs[p.ID]; len(base) > 0 || len(a.vips) > 0 {
				e.lb = &lbAddrs{base: base, vips: a.vips}
			}
			e.ExternalNetwork = b.externalFallback(p, a.lb.VIPPortID)
		} else {
			e.ExternalNetwork = b.externalFallback(p)
		}
		e.tenant = b.intern(e.TenantID)
		e.domainKey, _ = b.portDomain(p.ID)
		b.portTenant[p.ID] = e.TenantID
		if sp, ok := subs[p.ID]; ok && sp.vlan != 0 {
			k := vlanKey{mac, sp.vlan}
			if prev, dup := b.vlanEPs[k]; dup {
				b.anomaly(AnomalyTrunkSkipped, "port", p.ID, "MAC %s VLAN %d also subport %s: neither attributed by VLAN", FormatMAC(mac), sp.vlan, prev.PortID)
				b.vlanEPs[k] = nil
			} else {
				b.vlanEPs[k] = e
			}
		}
		if sp, ok := subs[p.ID]; ok && sp.parentMAC != 0 && mac == sp.parentMAC {
			continue // Neutron's default: the parent's MAC, told apart by the VLAN only
		}
		claims[mac] = append(claims[mac], claim{e: e, primary: true})
		for _, pair := range p.AllowedAddressPairs {
			if pair.MACAddress == "" {
				continue
			}
			pm, ok := ParseMAC(pair.MACAddress)
			if !ok {
				b.anomaly(AnomalyInvalidMAC, "port", p.ID, "allowed_address_pairs mac_address %q does not parse", pair.MACAddress)
				continue
			}
			if pm == mac {
				continue
			}
			ae := *e
			ae.AAP = true
			claims[pm] = append(claims[pm], claim{e: &ae})
		}
	}
	out := make(map[uint64]*Endpoint, len(claims))
	for mac, cs := range claims {
		if e := b.settle(mac, cs); e != nil {
			out[mac] = e
			st.Endpoints++
			if e.Amphora {
				st.AmphoraMACs++
			}
		}
	}
	return out
}

// settle picks the owner of a MAC several ports claim. A port's own MAC
// beats address pairs. Several claimants of one tenant: the smallest port
// id keeps it (address pairs of several ports: the tenant only, server and
// port blank). Claimants of different tenants: nobody (unknown beats
// billing the wrong tenant).
func (b *builder) settle(mac uint64, cs []claim) *Endpoint {
	if len(cs) == 1 {
		return cs[0].e
	}
	var prim []claim
	for _, c := range cs {
		if c.primary {
			prim = append(prim, c)
		}
	}
	if len(prim) == 1 {
		return prim[0].e
	}
	if len(prim) > 1 {
		cs = prim
	}
	slices.SortFunc(cs, func(x, y claim) int { return cmp.Compare(x.e.PortID, y.e.PortID) })
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.e.PortID
	}
	for _, c := range cs[1:] {
		if c.e.TenantID != cs[0].e.TenantID {
			b.anomaly(AnomalyDuplicateMAC, "port", cs[0].e.PortID, "MAC %s claimed by ports %s of different tenants: not admitted", FormatMAC(mac), strings.Join(ids, ","))
			return nil
		}
	}
	if len(prim) > 1 {
		b.anomaly(AnomalyDuplicateMAC, "port", cs[0].e.PortID, "MAC %s claimed by ports %s: %s keeps it", FormatMAC(mac), strings.Join(ids, ","), cs[0].e.PortID)
		return cs[0].e
	}
	// address pairs only, one tenant, several ports: keep the tenant
	e := *cs[0].e
	for _, c := range cs[1:] {
		if c.e.ServerID != e.ServerID {
			e.ServerID = ""
		}
		if c.e.PortID != e.PortID {
			e.PortID = ""
		}
		if c.e.ExternalNetwork != e.ExternalNetwork {
			e.ExternalNetwork = ""
		}
	}
	return &e
}

// prefixRows writes trie steps 1–4 (§1.7), for IPv4 and IPv6.
func (b *builder) prefixRows() {
	b.addRow(0, netip.MustParsePrefix("0.0.0.0/0"), rowVal{zone: schemas.ZoneExternal})
	b.addRow(0, netip.MustParsePrefix("::/0"), rowVal{zone: schemas.ZoneExternal})
	b.addRow(0, netip.PrefixFrom(MetadataV4, 32), rowVal{zone: schemas.ZoneInfra})
	b.addRow(0, netip.PrefixFrom(MetadataV6, 128), rowVal{zone: schemas.ZoneInfra})
	// Link-local addresses never leave the L2 segment: neighbour
	// discovery with the router's fe80:: address is plumbing, not
	// internet traffic (the catch-all would bill it as external).
	b.addRow(0, netip.MustParsePrefix("169.254.0.0/16"), rowVal{zone: schemas.ZoneInfra})
	b.addRow(0, netip.MustParsePrefix("fe80::/10"), rowVal{zone: schemas.ZoneInfra})
	ids := make([]string, 0, len(b.subnets))
	for id := range b.subnets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		si := b.subnets[id]
		n := si.net
		owned := !n.Shared && !n.External && n.Project() != ""
		switch {
		case n.External: // external networks never produce subnet rows
		case n.Shared:
			b.addRow(0, si.prefix, rowVal{zone: schemas.ZoneShared})
		case owned:
			b.addRow(b.intern(n.Project()), si.prefix, rowVal{zone: schemas.ZoneSameTenant, peer: n.Project()})
		}
		if si.gw.IsValid() {
			b.infraHost(si, si.gw, owned)
		}
	}
	for i := range b.inv.Ports {
		p := &b.inv.Ports[i]
		if !IsInfraPort(p.DeviceOwner) {
			continue
		}
		for _, f := range p.FixedIPs {
			a, ok := parseAddr(f.IPAddress)
			if !ok {
				continue
			}
			si := b.subnets[f.SubnetID]
			owned := si != nil && !si.net.Shared && !si.net.External && si.net.Project() != ""
			b.infraHost(si, a, owned)
		}
	}
}

// infraHost writes an infra /32 or /128 globally and, for an address on a
// tenant-owned network, also in the owner's table, where it beats the
// owner's subnet row (tenant rows are consulted before global ones).
func (b *builder) infraHost(si *subnetInfo, a netip.Addr, owned bool) {
	p := netip.PrefixFrom(a, a.BitLen())
	b.addRow(0, p, rowVal{zone: schemas.ZoneInfra})
	if owned {
		b.addRow(b.intern(si.net.Project()), p, rowVal{zone: schemas.ZoneInfra})
	}
}

// routeRows writes trie step 5: every extraroute of a router owned by T,
// resolved through its next hops (§1.8), into T's table.
func (b *builder) routeRows() {
	ids := make([]string, 0, len(b.routers))
	for id := range b.routers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ri := b.routers[id]
		src := ri.r.Project()
		if src == "" {
			continue
		}
		for _, rt := range ri.r.Routes {
			dest, err := netip.ParsePrefix(strings.TrimSpace(rt.Destination))
			if err != nil || dest.Addr().Zone() != "" {
				b.anomaly(AnomalyInvalidCIDR, "router", id, "route destination %q does not parse", rt.Destination)
				continue
			}
			nh, ok := parseAddr(rt.NextHop)
			if !ok || nh.Is4() != dest.Addr().Is4() {
				b.anomaly(AnomalyInvalidIP, "router", id, "route nexthop %q does not parse or is not in the destination's family", rt.NextHop)
				continue
			}
			v := b.resolve(ri, src, dest.Masked(), nh)
			b.addRow(b.intern(src), dest, v)
		}
	}
}

func (b *builder) flattenTables(st *Stats) ([]tables, []tables, []rowVal) {
	var vals []rowVal
	valIdx := map[rowVal]int32{}
	flat := func(m map[netip.Prefix]rowVal) tables {
		var r4, r6 []row
		for p, v := range m {
			v.bits = uint8(p.Bits())
			i, ok := valIdx[v]
			if !ok {
				i = int32(len(vals))
				vals = append(vals, v)
				valIdx[v] = i
			}
			if p.Addr().Is4() {
				r4 = append(r4, row{p, i})
			} else {
				r6 = append(r6, row{p, i})
			}
		}
		st.Rows4 += len(r4)
		st.Rows6 += len(r6)
		return tables{v4: buildLPM4(r4), v6: buildLPM6(r6)}
	}
	t := make([]tables, len(b.tenants)+1)
	for tenant, m := range b.rows {
		t[tenant] = flat(m)
	}
	d := make([]tables, len(b.drows))
	for i, m := range b.drows {
		if m != nil {
			d[i] = flat(m)
		}
	}
	return t, d, vals
}

// carryGhosts keeps MACs that left the inventory attributing until their
// deadline (§3.5). A MAC present in the new inventory never inherits the
// old owner: the new endpoint replaces the ghost.
func (b *builder) carryGhosts(s *Snapshot, eps map[uint64]*Endpoint) {
	prev := b.opt.Prev
	if prev == nil || b.opt.GhostGrace <= 0 {
		return
	}
	nowUS := b.opt.Now.UnixMicro()
	deadline := b.opt.Now.Add(b.opt.GhostGrace).UnixMicro()
	for mac, pe := range prev.macs {
		e := pe.ep
		if e == nil {
			continue
		}
		if _, live := eps[mac]; live {
			continue
		}
		if e.DeleteAtUS != 0 && e.DeleteAtUS <= nowUS {
			continue
		}
		g := *e
		if g.DeleteAtUS == 0 {
			g.DeleteAtUS = deadline
			// the inventory packs many ports' strings into one
			// allocation: a ghost keeps copies, not the old inventory's
			g.TenantID, g.ServerID, g.PortID = strings.Clone(g.TenantID), strings.Clone(g.ServerID), strings.Clone(g.PortID)
			g.NetworkID, g.ExternalNetwork, g.LBID = strings.Clone(g.NetworkID), strings.Clone(g.ExternalNetwork), strings.Clone(g.LBID)
			g.domainKey = strings.Clone(g.domainKey)
		}
		// the ghost's tenant index must point into this snapshot's tables;
		// 0 (global rows only) when the tenant has none any more
		g.tenant = 0
		if i, ok := s.tenantIdx[g.TenantID]; ok && int(i) < len(s.tables) {
			g.tenant = i
		}
		g.domain = b.domainFor(&g) // empty when no live port uses that domain any more
		eps[mac] = &g
		s.stats.Ghosts++
	}
}

// Inputs is the part of inv that Build reads, for a caller that keeps an
// inventory only to rebuild snapshots from it: no projects or servers
// (Build reads neither), and with trimFIPs floating IPs reduced to their
// port and network (a copy of the list; worth it only when nothing else
// holds inv). Build(Inputs(inv, …)) attributes exactly as Build(inv).
func Inputs(inv *inventory.Inventory, trimFIPs bool) *inventory.Inventory {
	if inv == nil {
		return nil
	}
	c := *inv
	c.Projects, c.Servers = nil, nil
	if trimFIPs && len(inv.FloatingIPs) > 0 {
		c.FloatingIPs = make([]inventory.FloatingIP, len(inv.FloatingIPs))
		for i := range inv.FloatingIPs {
			f := &inv.FloatingIPs[i]
			c.FloatingIPs[i] = inventory.FloatingIP{PortID: f.PortID, FloatingNetworkID: f.FloatingNetworkID}
		}
	}
	return &c
}
