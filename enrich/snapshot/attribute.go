package snapshot

import (
	"net/netip"

	"github.com/tapflow/tapflow/schemas"
)

// lookupMAC finds a live (or not yet expired ghost) endpoint.
func (s *Snapshot) lookupMAC(mac uint64, nowUS int64) (macEntry, bool) {
	e, ok := s.macs[mac]
	return e, ok && e.ep != nil && (e.deleteAt == 0 || nowUS < e.deleteAt)
}

// lookupPrefix is the longest-prefix match on the VM tenant's rows and the
// rows reachable from its port's subnets (domain) — the longer match wins,
// the tenant's on a tie — and then on the global rows; the global table
// always matches (catchall external).
func (s *Snapshot) lookupPrefix(tenant, domain uint32, a netip.Addr) *rowVal {
	var i, d int32 = -1, -1
	if a.Is4() {
		b := a.As4()
		k := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		if tenant != 0 && int(tenant) < len(s.tables) {
			i = s.tables[tenant].v4.lookup(k)
		}
		if domain != 0 && int(domain) < len(s.domains) {
			d = s.domains[domain].v4.lookup(k)
		}
		if i < 0 && d < 0 {
			i = s.tables[0].v4.lookup(k)
		}
	} else {
		k := addrKey(a)
		if tenant != 0 && int(tenant) < len(s.tables) {
			i = s.tables[tenant].v6.lookup(k)
		}
		if domain != 0 && int(domain) < len(s.domains) {
			d = s.domains[domain].v6.lookup(k)
		}
		if i < 0 && d < 0 {
			i = s.tables[0].v6.lookup(k)
		}
	}
	if d >= 0 && (i < 0 || s.vals[d].bits > s.vals[i].bits) {
		i = d
	}
	if i < 0 {
		return nil
	}
	return &s.vals[i]
}

// lookupPrefixRange is lookupPrefix of the address k (addrKey; v6 its
// family) that returns the row's index into s.vals (-1: none) and the
// range [lo, hi] around k over which every table it consulted gives the
// same answer, so the answer holds for any address in it (Memo).
func (s *Snapshot) lookupPrefixRange(tenant, domain uint32, k u128, v6 bool) (int32, u128, u128) {
	var i, d int32 = -1, -1
	lo, hi := u128{}, u128{^uint64(0), ^uint64(0)}
	if !v6 {
		hi = u128{0, 1<<32 - 1}
		a := uint32(k.lo)
		l, h := uint32(0), ^uint32(0)
		if tenant != 0 && int(tenant) < len(s.tables) {
			i = s.tables[tenant].v4.lookupRange(a, &l, &h)
		}
		if domain != 0 && int(domain) < len(s.domains) {
			d = s.domains[domain].v4.lookupRange(a, &l, &h)
		}
		if i < 0 && d < 0 {
			i = s.tables[0].v4.lookupRange(a, &l, &h)
		}
		lo.lo, hi.lo = uint64(l), uint64(h)
	} else {
		if tenant != 0 && int(tenant) < len(s.tables) {
			i = s.tables[tenant].v6.lookupRange(k, &lo, &hi)
		}
		if domain != 0 && int(domain) < len(s.domains) {
			d = s.domains[domain].v6.lookupRange(k, &lo, &hi)
		}
		if i < 0 && d < 0 {
			i = s.tables[0].v6.lookupRange(k, &lo, &hi)
		}
	}
	if d >= 0 && (i < 0 || s.vals[d].bits > s.vals[i].bits) {
		i = d
	}
	return i, lo, hi
}

// member names the pool member of load balancer lb at addr: the one
// whose protocol_port is port when several share the address, else empty.
func (s *Snapshot) member(lb string, addr netip.Addr, port uint16) (pool, member string) {
	ms := s.members[memberKey{lb, addr}]
	if len(ms) == 1 {
		return ms[0].pool, ms[0].member
	}
	for _, m := range ms {
		if m.port == port && port != 0 {
			return m.pool, m.member
		}
	}
	return "", ""
}

func has(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}

// Attribute attributes one record. It does not allocate and is safe for
// concurrent use. AttributeMemo is the same for the records of a batch. The order of the rules is the domain reference's §1.3
// with §2's Octavia branch:
//
//  1. destination MAC with the group bit → multicast (tenant still from the
//     VM MAC when known; on receive, from the tap's port);
//  2. VM MAC unknown (or its ghost expired) → unknown / miss;
//  3. peer MAC a known VM-like port → amphora base-address test (infra,
//     segment 2), else exact tenant comparison;
//  4. otherwise longest prefix on (VM tenant, remote IP) and on the rows
//     reachable from the VM port's subnets through their routers, then
//     global rows;
//  5. external records get the exit label: the peer router MAC's network,
//     else the VM port's fallback, else none.
func (s *Snapshot) Attribute(in *Input, out *Result) { s.attribute(nil, nil, in, out) }

// AttributeMemo is Attribute through m: the same result, at one map or
// table lookup per distinct MAC and address range m has not seen yet
// with s (while m's gates find that it pays). m must not be shared
// between goroutines.
func (s *Snapshot) AttributeMemo(m *Memo, in *Input, out *Result) {
	m.use(s)
	mm, pm := m.memos()
	s.attribute(mm, pm, in, out)
}

// live is the ghost check of lookupMAC on an entry the map returned.
func live(e macEntry, ok bool, nowUS int64) bool {
	return ok && e.ep != nil && (e.deleteAt == 0 || nowUS < e.deleteAt)
}

// attribute is Attribute with its MAC lookups through m and its prefix
// lookups through pm (nil: none).
func (s *Snapshot) attribute(m, pm *Memo, in *Input, out *Result) {
	*out = Result{TenantID: schemas.UnknownTenant, ExternalNetwork: schemas.NoExternalNetwork, Zone: schemas.ZoneMiss, Version: s.version}
	local, remote := in.LocalIP.Unmap(), in.RemoteIP.Unmap()
	// the memo's calls are spelled out, not wrapped: a wrapper does not
	// inline, and Attribute without a memo should pay nothing for it
	var vme macEntry
	var known bool
	if m != nil {
		vme, known = m.mac1(s, in.VMMAC)
	} else {
		vme, known = s.macs[in.VMMAC]
	}
	known = live(vme, known, in.NowUS)
	if in.VLAN != 0 {
		// a tagged frame: the trunk subport of (MAC, VLAN); a VLAN no
		// subport claims stays with the parent (the MAC's port)
		var e macEntry
		var ok bool
		if m != nil {
			e, ok = m.vlan1(s, in.VMMAC, in.VLAN)
		} else {
			e, ok = s.vlans[vlanKey{in.VMMAC, in.VLAN}]
		}
		if ok && e.ep != nil {
			vme, known = e, true
		}
	}
	if !known && in.Dir == schemas.DirRX && IsGroupMAC(in.VMMAC) && in.Tap != "" {
		// Received multicast/broadcast: the tap names the receiving port.
		if k, ok := tapKeyOf(in.Tap); ok {
			if mac, ok := s.taps[k]; ok {
				if m != nil {
					vme, known = m.mac1(s, mac)
				} else {
					vme, known = s.macs[mac]
				}
				known = live(vme, known, in.NowUS)
			}
		}
	}
	vm := vme.ep
	if known {
		out.TenantID, out.ServerID, out.PortID = vm.TenantID, vm.ServerID, vm.PortID
		if vme.amphora {
			out.LBID, out.LBTap = vm.LBID, schemas.LBTapAmphora
		}
	}
	if in.Dir == schemas.DirInvalid {
		return
	}
	if IsGroupMAC(in.DstMAC()) {
		out.Zone = schemas.ZoneMulticast
		// Late binding like any other record, when a later snapshot can
		// name the VM: by its MAC, or on receive by its tap.
		out.UnknownVM = !known && (!IsGroupMAC(in.VMMAC) || in.Tap != "")
		return
	}
	if !known {
		out.UnknownVM = true
		return
	}
	if vme.amphora {
		switch {
		case has(vm.base(), local):
			out.LBSegment = 2
			// at the amphora: the member is the far end
			out.PoolID, out.MemberID = s.member(vm.LBID, remote, in.RemotePort)
		case has(vm.vips(), local):
			out.LBSegment = 1
		}
	}
	var pe macEntry
	var ok bool
	if m != nil {
		pe, ok = m.mac1(s, in.PeerMAC)
	} else {
		pe, ok = s.macs[in.PeerMAC]
	}
	if live(pe, ok, in.NowUS) {
		// direct L2 between two known endpoints
		out.PeerTenantID = s.tenants[pe.tenant]
		same := pe.tenant == vme.tenant
		if pe.tenant == 0 || vme.tenant == 0 { // a ghost of a tenant that left
			out.PeerTenantID = pe.ep.TenantID
			same = pe.ep.TenantID == vm.TenantID
		}
		switch {
		case vme.amphora && out.LBSegment == 2:
			out.Zone = schemas.ZoneInfra
		case pe.amphora && has(pe.ep.base(), remote):
			out.Zone, out.LBSegment = schemas.ZoneInfra, 2
			// at the member: this VM is the member, of the amphora's LB;
			// the amphora's tap saw these bytes too (lb_tap says which
			// side, so per-LB totals count them once)
			if out.LBID == "" {
				out.LBID, out.LBTap = pe.ep.LBID, schemas.LBTapMember
			}
			out.PoolID, out.MemberID = s.member(pe.ep.LBID, local, in.LocalPort)
		case same:
			out.Zone = schemas.ZoneSameTenant
		default:
			out.Zone = schemas.ZoneOtherTenant
		}
		if pe.amphora && out.LBSegment == 0 && has(pe.ep.vips(), remote) {
			out.LBSegment = 1
		}
		return
	}
	if !remote.IsValid() {
		return // no address to classify: miss
	}
	var r *rowVal
	if pm != nil {
		r = pm.prefix1(s, vme.tenant, vme.domain, addrKey(remote), !remote.Is4())
	} else {
		r = s.lookupPrefix(vme.tenant, vme.domain, remote)
	}
	if r == nil {
		return
	}
	out.Zone, out.PeerTenantID = r.zone, r.peer
	if r.zone == schemas.ZoneOtherTenant && r.peer == vm.TenantID {
		// a domain row names the owner; it is the VM's own tenant
		out.Zone = schemas.ZoneSameTenant
	}
	if r.zone != schemas.ZoneExternal {
		return
	}
	if ok && pe.label >= 0 {
		out.ExternalNetwork = s.labels[pe.label]
	} else if vm.ExternalNetwork != "" {
		out.ExternalNetwork = vm.ExternalNetwork
	}
}
