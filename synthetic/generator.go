package synthetic

import (
	"math/rand/v2"
	"net/netip"
	"slices"

	"github.com/tapflow/tapflow/schemas"
)

// ExpectedMetadataVersion is the metadata_version of attributed records: the
// version of the first snapshot an enrich.Engine builds from Inventory().
const ExpectedMetadataVersion = 1

const (
	protoICMP = 1
	protoIGMP = 2
	protoTCP  = 6
	protoUDP  = 17

	// TCP flags
	flagFIN = 0x01
	flagSYN = 0x02
	flagRST = 0x04
	flagPSH = 0x08
	flagACK = 0x10

	// vrrpMAC is the virtual MAC of a provider network's physical gateway:
	// a next hop the inventory does not know.
	vrrpMAC      = "00:00:5e:00:01:01"
	mdnsMAC      = "01:00:5e:00:00:fb"
	allHostsMAC  = "01:00:5e:00:00:01"
	broadcastMAC = "ff:ff:ff:ff:ff:ff"
	metadataIP   = "169.254.169.254"
)

var (
	zoneSame     = schemas.ZoneSameTenant.String()
	zoneOther    = schemas.ZoneOtherTenant.String()
	zoneShared   = schemas.ZoneShared.String()
	zoneExternal = schemas.ZoneExternal.String()
	zoneInfra    = schemas.ZoneInfra.String()
	zoneMcast    = schemas.ZoneMulticast.String()
	zoneMiss     = schemas.ZoneMiss.String()
)

type service struct{ proto, port int32 }

var (
	eastWest = []service{{protoTCP, 22}, {protoTCP, 80}, {protoTCP, 443}, {protoTCP, 443}, {protoTCP, 3306}, {protoTCP, 5432},
		{protoTCP, 6379}, {protoTCP, 8080}, {protoTCP, 9092}, {protoUDP, 514}, {protoUDP, 8125}, {protoICMP, 0}}
	outbound  = []service{{protoTCP, 443}, {protoTCP, 443}, {protoTCP, 443}, {protoTCP, 80}, {protoUDP, 53}, {protoUDP, 123}, {protoICMP, 0}}
	inbound   = []service{{protoTCP, 22}, {protoTCP, 443}, {protoTCP, 80}}
	sharedSvc = []service{{protoTCP, 443}, {protoTCP, 2049}, {protoTCP, 3260}, {protoTCP, 80}}
	lbFront   = []service{{protoTCP, 80}, {protoTCP, 443}}
)

// attribution is what the enrich stage should write into a record.
type attribution struct {
	tenant, server, port, zone, peerTenant, extNet, lbID string
	lbTap                                                string // with lbID: amphora, or member (segment 2 at the member)
	lbSegment                                            int32
	zoneCode                                             schemas.Zone // zone's enum (newFlow)
}

func (e *endpoint) attr(zone string) attribution {
	a := attribution{tenant: e.tenant, server: e.server, port: e.port, lbID: e.lbID, zone: zone, extNet: schemas.NoExternalNetwork}
	if e.lbID != "" {
		a.lbTap = schemas.LBTapAmphora
	}
	if e.tenantIdx < 0 {
		a.tenant = schemas.UnknownTenant
	}
	return a
}

// exit is the external_network of an external record at e's tap: the peer
// router's exit when the next hop is e's router and it has one, else the
// port's fallback, else none.
func (e *endpoint) exit(viaRouter bool) string {
	switch {
	case viaRouter && e.exitLabel != "":
		return e.exitLabel
	case e.fallbackLabel != "":
		return e.fallbackLabel
	}
	return schemas.NoExternalNetwork
}

// flow is one capture key (tap, direction, 5-tuple) in the active table.
type flow struct {
	ifname, dir, vmMAC, peerMAC, srcIP, dstIP string
	kind                                      string // the rule it exercises, for test diagnostics
	attr                                      attribution
	start                                     int64 // µs: creation, then the previous record's time_end
	proto, sport, dport                       int32
	size                                      int32 // bytes per packet
	burst                                     int32 // packets per record are 1..burst
	first                                     bool
	class                                     class
	bin                                       schemas.FlowBin // the addresses in binary, set once per flow (newFlow)
}

// generator is the deterministic record stream: a table of active flows
// visited round robin. Each visit emits one record; with probability
// 1/records-per-flow it is the flow's last and a new flow takes the slot.
// The stream depends only on the config (and the seed), never on timing:
// the clock only fills time_start and time_end.
type generator struct {
	tp         *topology
	rng        *rand.Rand
	cum        [numClasses]float64
	total      float64
	pEnd       float64
	flows      []flow
	next       int
	node       string
	attributed bool
	trace      func(*flow) // test hook: called with each emitted record's flow
}

func newGenerator(c Config, tp *topology, node string, nowUS int64) *generator {
	g := &generator{
		tp:         tp,
		rng:        rand.New(rand.NewPCG(uint64(c.Seed), 0x7a9f_10c5_eed5_0001)),
		pEnd:       1 / c.recordsPerFlow(),
		flows:      make([]flow, c.FlowsPerSecond),
		node:       node,
		attributed: c.Attributed,
	}
	for i, w := range c.weights() {
		g.total += w
		g.cum[i] = g.total
	}
	for i := range g.flows {
		g.newFlow(&g.flows[i], nowUS)
	}
	return g
}

// fill appends n records to dst, all with time_end nowUS.
func (g *generator) fill(dst []schemas.Flow, n int, nowUS int64) []schemas.Flow {
	dst = slices.Grow(dst, n)
	for range n {
		fl := &g.flows[g.next]
		if g.next++; g.next == len(g.flows) {
			g.next = 0
		}
		end := g.rng.Float64() < g.pEnd
		dst = dst[:len(dst)+1] // emit overwrites every field
		g.emit(&dst[len(dst)-1], fl, end, nowUS)
		if g.trace != nil {
			g.trace(fl)
		}
		if end {
			g.newFlow(fl, nowUS)
		} else {
			fl.start, fl.first = nowUS, false
		}
	}
	return dst
}

func (g *generator) emit(f *schemas.Flow, fl *flow, end bool, nowUS int64) {
	pk := int64(1 + g.rng.IntN(int(fl.burst)))
	reason, flags := "active_timeout", int32(0)
	if fl.proto == protoTCP {
		flags = flagACK | flagPSH
		if fl.first {
			flags |= flagSYN
		}
		if end {
			if g.rng.IntN(8) == 0 {
				flags, reason = flags|flagRST, "rst"
			} else {
				flags, reason = flags|flagFIN, "fin"
			}
		}
	} else if end {
		reason = "idle_timeout"
	}
	// One composite store: a single bulk write barrier instead of one per
	// string field while the GC runs.
	if !g.attributed {
		*f = schemas.Flow{
			TimeStart: min(fl.start, nowUS), TimeEnd: nowUS,
			Node: g.node, Ifname: fl.ifname, Direction: fl.dir, VMMAC: fl.vmMAC, PeerMAC: fl.peerMAC,
			IPVersion: 4, Protocol: fl.proto, SrcIP: fl.srcIP, DstIP: fl.dstIP, SrcPort: fl.sport, DstPort: fl.dport,
			TCPFlags: flags, Packets: pk, Bytes: pk * int64(fl.size), EndReason: reason,
			Bin: fl.bin,
		}
		return
	}
	a := &fl.attr
	*f = schemas.Flow{
		TimeStart: min(fl.start, nowUS), TimeEnd: nowUS,
		Node: g.node, Ifname: fl.ifname, Direction: fl.dir, VMMAC: fl.vmMAC, PeerMAC: fl.peerMAC,
		IPVersion: 4, Protocol: fl.proto, SrcIP: fl.srcIP, DstIP: fl.dstIP, SrcPort: fl.sport, DstPort: fl.dport,
		TCPFlags: flags, Packets: pk, Bytes: pk * int64(fl.size), EndReason: reason,
		TenantID: a.tenant, ServerID: a.server, PortID: a.port, Zone: a.zone, PeerTenantID: a.peerTenant,
		ExternalNetwork: a.extNet, LBID: a.lbID, LBSegment: a.lbSegment, LBTap: a.lbTap, MetadataVersion: ExpectedMetadataVersion,
		Bin: fl.bin,
	}
	f.Bin.Zone = a.zoneCode
}

func (g *generator) pickClass() class {
	x := g.rng.Float64() * g.total
	for i, c := range g.cum {
		if x < c {
			return class(i)
		}
	}
	for i := numClasses - 1; ; i-- { // rounding at the top: the last class with weight
		if i == 0 || g.cum[i] > g.cum[i-1] {
			return i
		}
	}
}

func (g *generator) newFlow(fl *flow, nowUS int64) {
	*fl = flow{start: nowUS, first: true, class: g.pickClass()}
	switch fl.class {
	case classSameTenant:
		g.sameTenant(fl)
	case classOtherTenant:
		g.otherTenant(fl)
	case classShared:
		g.shared(fl)
	case classExternal:
		g.external(fl)
	case classInfra:
		g.infra(fl)
	case classMulticast:
		g.multicast(fl)
	case classMiss:
		g.miss(fl)
	case classLBSegment1:
		g.lbSegment1(fl)
	case classLBSegment2:
		g.lbSegment2(fl)
	}
	fl.bin = binOf(fl)
	fl.attr.zoneCode = zoneCode(fl.attr.zone)
}

// binOf is the binary form of fl's addresses: the records carry both it
// and the text (the text is what the JSON-lines baseline and the tests
// read; the agent's stages and the wire encoder take the binary form, as
// they do from the capture). Parsing here, once per flow, allocates
// nothing.
func binOf(fl *flow) schemas.FlowBin {
	b := schemas.FlowBin{Valid: true, Dir: schemas.ParseDirection(fl.dir)}
	vm, ok1 := schemas.ParseMAC(fl.vmMAC)
	peer, ok2 := schemas.ParseMAC(fl.peerMAC)
	src, err1 := netip.ParseAddr(fl.srcIP)
	dst, err2 := netip.ParseAddr(fl.dstIP)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || b.Dir == schemas.DirInvalid {
		return schemas.FlowBin{} // not expressible in binary: a text record
	}
	b.VMMAC, b.PeerMAC, b.SrcIP, b.DstIP = vm, peer, src, dst
	return b
}

// zoneCode is the enum of a zone label.
func zoneCode(label string) schemas.Zone {
	for _, z := range schemas.Zones {
		if z.String() == label {
			return z
		}
	}
	return schemas.ZoneMiss
}

func (g *generator) coin() bool              { return g.rng.Uint64()&1 == 0 }
func (g *generator) eph() int32              { return int32(32768 + g.rng.IntN(28232)) }
func (g *generator) svc(s []service) service { return s[g.rng.IntN(len(s))] }
func (g *generator) vm(t, v int) *endpoint   { return &g.tp.vms[t*g.tp.vmsPer+v] }
func (g *generator) anyVM() *endpoint        { return &g.tp.vms[g.rng.IntN(len(g.tp.vms))] }
func (g *generator) internet(s service) string {
	if s.port == 53 {
		return g.tp.internet[g.rng.IntN(2)] // resolvers
	}
	return g.tp.internet[2+g.rng.IntN(len(g.tp.internet)-2)]
}

// otherThan returns a uniform index in [0, n) other than i (n ≥ 2).
func (g *generator) otherThan(i, n int) int {
	j := g.rng.IntN(n - 1)
	if j >= i {
		j++
	}
	return j
}

// set fills the wire fields of a conversation seen at ep's tap. client
// tells whether the VM side opened it; the direction is drawn. ICMP
// carries the type in the source port (echo request from the client) and
// the code in the destination port.
func (g *generator) set(fl *flow, ep *endpoint, localIP, peerMAC, remoteIP string, proto, lp, rp int32, client bool) {
	tx := g.coin()
	fl.ifname, fl.vmMAC, fl.peerMAC, fl.proto = ep.ifname, ep.mac, peerMAC, proto
	if tx {
		fl.dir, fl.srcIP, fl.dstIP, fl.sport, fl.dport = "tx", localIP, remoteIP, lp, rp
	} else {
		fl.dir, fl.srcIP, fl.dstIP, fl.sport, fl.dport = "rx", remoteIP, localIP, rp, lp
	}
	if proto == protoICMP {
		fl.sport, fl.dport = 0, 0
		if tx == client {
			fl.sport = 8
		}
	}
	g.profile(fl)
}

// conv is set for a VM-side address and a service: the client end uses an
// ephemeral port.
func (g *generator) conv(fl *flow, ep *endpoint, peerMAC, remoteIP string, s service, client bool) {
	lp, rp := g.eph(), s.port
	if !client {
		lp, rp = rp, lp
	}
	g.set(fl, ep, ep.ip, peerMAC, remoteIP, s.proto, lp, rp, client)
}

var tcpBursts = [...]int32{1, 2, 4, 16, 64, 512}

func (g *generator) profile(fl *flow) {
	switch fl.proto {
	case protoTCP:
		fl.size, fl.burst = int32(60+g.rng.IntN(1455)), tcpBursts[g.rng.IntN(len(tcpBursts))]
	case protoUDP:
		fl.size, fl.burst = int32(80+g.rng.IntN(433)), int32(1+g.rng.IntN(8))
	case protoICMP:
		fl.size, fl.burst = 98, int32(1+g.rng.IntN(4))
	default:
		fl.size, fl.burst = 60, 1
	}
}

func (g *generator) sameTenant(fl *flow) {
	t, v := g.rng.IntN(g.tp.tenants), g.rng.IntN(g.tp.vmsPer)
	w := g.otherThan(v, g.tp.vmsPer)
	a, b := g.vm(t, v), g.vm(t, w)
	peer, kind := a.routerMAC, "same_tenant routed: peer MAC is the tenant's router, remote in its other subnet → tenant prefix row"
	if v%2 == w%2 {
		peer, kind = b.mac, "same_tenant L2: peer MAC is a VM of the same tenant"
	}
	g.conv(fl, a, peer, b.ip, g.svc(eastWest), g.coin())
	fl.attr, fl.kind = a.attr(zoneSame), kind
	fl.attr.peerTenant = b.tenant
}

func (g *generator) otherTenant(fl *flow) {
	t := g.rng.IntN(g.tp.tenants)
	u := g.otherThan(t, g.tp.tenants)
	a, b := g.vm(t, g.rng.IntN(g.tp.vmsPer)), g.vm(u, g.rng.IntN(g.tp.vmsPer))
	g.conv(fl, a, b.mac, b.ip, g.svc(eastWest), g.coin())
	fl.attr, fl.kind = a.attr(zoneOther), "other_tenant L2: peer MAC is a VM of another tenant"
	fl.attr.peerTenant = b.tenant
}

func (g *generator) shared(fl *flow) {
	a := g.anyVM()
	g.conv(fl, a, a.routerMAC, g.tp.shared[g.rng.IntN(len(g.tp.shared))], g.svc(sharedSvc), true)
	fl.attr, fl.kind = a.attr(zoneShared), "shared: remote on the shared network through the router → global shared row"
}

// externalKinds by [through the router][VM is the client].
var externalKinds = [2][2]string{
	{"external through an unknown next hop: the port's fallback exit (floating IP network, else gateway router), inbound to the floating IP",
		"external through an unknown next hop: the port's fallback exit (floating IP network, else gateway router)"},
	{"external through the router: exit label of the peer router MAC, inbound to the floating IP",
		"external through the router: exit label of the peer router MAC"},
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (g *generator) external(fl *flow) {
	a := g.anyVM()
	s, client := g.svc(outbound), true
	if a.fip && g.coin() {
		s, client = g.svc(inbound), false // a client on the internet through the floating IP
	}
	peer, viaRouter := a.routerMAC, true
	if g.rng.IntN(8) == 0 {
		peer, viaRouter = vrrpMAC, false
	}
	kind := externalKinds[b2i(viaRouter)][b2i(client)]
	g.conv(fl, a, peer, g.internet(s), s, client)
	fl.attr, fl.kind = a.attr(zoneExternal), kind
	fl.attr.extNet = a.exit(viaRouter)
}

func (g *generator) infra(fl *flow) {
	a := g.anyVM()
	switch g.rng.IntN(6) {
	case 0, 1, 2:
		g.conv(fl, a, a.routerMAC, metadataIP, service{protoTCP, 80}, true)
		fl.kind = "infra: metadata service 169.254.169.254 → global infra row"
	case 3:
		g.conv(fl, a, a.dhcpMAC, a.dhcpIP, service{protoUDP, 53}, true)
		fl.kind = "infra: DNS to the DHCP port → infra host row in the owner's table"
	case 4:
		g.set(fl, a, a.ip, a.dhcpMAC, a.dhcpIP, protoUDP, 68, 67, true)
		fl.kind = "infra: DHCP renewal to the DHCP port → infra host row in the owner's table"
	default:
		g.conv(fl, a, a.routerMAC, a.gatewayIP, service{protoICMP, 0}, true)
		fl.kind = "infra: ping of the subnet gateway → infra host row in the owner's table"
	}
	fl.attr = a.attr(zoneInfra)
}

func (g *generator) multicast(fl *flow) {
	t, v := g.rng.IntN(g.tp.tenants), g.rng.IntN(g.tp.vmsPer)
	a := g.vm(t, v)
	switch r := g.rng.IntN(10); {
	case r < 5:
		fl.ifname, fl.dir, fl.vmMAC, fl.peerMAC = a.ifname, "tx", a.mac, mdnsMAC
		fl.srcIP, fl.dstIP, fl.proto, fl.sport, fl.dport = a.ip, "224.0.0.251", protoUDP, 5353, 5353
		fl.attr, fl.kind = a.attr(zoneMcast), "multicast tx: destination (peer) MAC has the group bit; tenant from the VM MAC"
	case r < 7:
		fl.ifname, fl.dir, fl.vmMAC, fl.peerMAC = a.ifname, "tx", a.mac, broadcastMAC
		fl.srcIP, fl.dstIP, fl.proto, fl.sport, fl.dport = "0.0.0.0", "255.255.255.255", protoUDP, 68, 67
		fl.attr, fl.kind = a.attr(zoneMcast), "multicast tx: DHCP discover to the broadcast MAC"
	default:
		// Received: on rx the VM-side MAC is the wire destination, the group
		// address; the tap names the VM (attribution rule 2).
		fl.ifname, fl.dir = a.ifname, "rx"
		if g.tp.vmsPer >= 2 && g.coin() {
			b := g.vm(t, g.otherThan(v, g.tp.vmsPer))
			fl.vmMAC, fl.peerMAC = mdnsMAC, b.mac
			fl.srcIP, fl.dstIP, fl.proto, fl.sport, fl.dport = b.ip, "224.0.0.251", protoUDP, 5353, 5353
		} else {
			fl.vmMAC, fl.peerMAC = allHostsMAC, a.routerMAC
			fl.srcIP, fl.dstIP, fl.proto = a.gatewayIP, "224.0.0.1", protoIGMP
		}
		fl.attr = a.attr(zoneMcast)
		fl.kind = "multicast rx: VM-side MAC is the group address; the tap names the VM"
	}
	g.profile(fl)
}

func (g *generator) miss(fl *flow) {
	u := &g.tp.unknown[g.rng.IntN(len(g.tp.unknown))]
	s := g.svc(outbound)
	g.conv(fl, u, u.routerMAC, g.internet(s), s, true)
	fl.attr, fl.kind = u.attr(zoneMiss), "miss: VM MAC not in the inventory"
}

// evenVM is a VM of tenant t on its first subnet, where the load balancers
// live (L2 with the amphorae).
func (g *generator) evenVM(t int) *endpoint {
	return g.vm(t, 2*g.rng.IntN((g.tp.vmsPer+1)/2))
}

func (g *generator) lbSegment1(fl *flow) {
	lb := &g.tp.lbs[g.rng.IntN(len(g.tp.lbs))]
	amp := &lb.amps[0] // MASTER: holds the VIP
	s := g.svc(lbFront)
	others := g.tp.tenants >= 2
	r := g.rng.IntN(6)
	switch {
	case r == 0 || (r == 1 && g.tp.vmsPer < 2) || (r == 2 && !others):
		c := g.evenVM(lb.owner)
		g.set(fl, amp, lb.vip, c.mac, c.ip, protoTCP, s.port, g.eph(), false)
		fl.attr, fl.kind = amp.attr(zoneSame), "lb_segment_1 at the amphora: VIP local, L2 client of the LB owner"
		fl.attr.peerTenant = c.tenant
	case r == 1:
		c := g.vm(lb.owner, 1+2*g.rng.IntN(g.tp.vmsPer/2))
		g.set(fl, amp, lb.vip, amp.routerMAC, c.ip, protoTCP, s.port, g.eph(), false)
		fl.attr, fl.kind = amp.attr(zoneSame), "lb_segment_1 at the amphora: VIP local, routed client in the owner's other subnet"
		fl.attr.peerTenant = g.tp.projects[lb.owner]
	case r == 2:
		c := g.vm(g.otherThan(lb.owner, g.tp.tenants), g.rng.IntN(g.tp.vmsPer))
		g.set(fl, amp, lb.vip, c.mac, c.ip, protoTCP, s.port, g.eph(), false)
		fl.attr, fl.kind = amp.attr(zoneOther), "lb_segment_1 at the amphora: VIP local, L2 client of another tenant"
		fl.attr.peerTenant = c.tenant
	case r == 3:
		g.set(fl, amp, lb.vip, amp.routerMAC, g.internet(s), protoTCP, s.port, g.eph(), false)
		fl.attr, fl.kind = amp.attr(zoneExternal), "lb_segment_1 at the amphora: VIP local, client outside the cloud through the router"
		fl.attr.extNet = amp.exit(true)
	case r == 4 || !others:
		c := g.evenVM(lb.owner)
		g.set(fl, c, c.ip, amp.mac, lb.vip, protoTCP, g.eph(), s.port, true)
		fl.attr, fl.kind = c.attr(zoneSame), "lb_segment_1 at the client: peer MAC is the amphora, remote its VIP (owner's VM)"
		fl.attr.peerTenant = amp.tenant
	default:
		c := g.vm(g.otherThan(lb.owner, g.tp.tenants), g.rng.IntN(g.tp.vmsPer))
		g.set(fl, c, c.ip, amp.mac, lb.vip, protoTCP, g.eph(), s.port, true)
		fl.attr, fl.kind = c.attr(zoneOther), "lb_segment_1 at the client: peer MAC is the amphora, remote its VIP (another tenant's VM)"
		fl.attr.peerTenant = amp.tenant
	}
	fl.attr.lbSegment = 1
}

func (g *generator) lbSegment2(fl *flow) {
	lb := &g.tp.lbs[g.rng.IntN(len(g.tp.lbs))]
	amp := &lb.amps[g.rng.IntN(2)] // both amphorae health-check the members
	m := &g.tp.vms[lb.members[g.rng.IntN(len(lb.members))]]
	if g.coin() {
		g.set(fl, amp, amp.ip, m.mac, m.ip, protoTCP, g.eph(), 80, true)
		fl.attr, fl.kind = amp.attr(zoneInfra), "lb_segment_2 at the amphora: base address local, member peer"
		fl.attr.peerTenant = m.tenant
	} else {
		g.set(fl, m, m.ip, amp.mac, amp.ip, protoTCP, 80, g.eph(), false)
		fl.attr, fl.kind = m.attr(zoneInfra), "lb_segment_2 at the member: peer MAC is an amphora, remote its base address"
		fl.attr.peerTenant = amp.tenant
		fl.attr.lbID = amp.lbID // the member's side names the LB too (flow.v1.1)
		fl.attr.lbTap = schemas.LBTapMember
	}
	fl.attr.lbSegment = 2
}
