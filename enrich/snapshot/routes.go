package snapshot

import (
	"net/netip"
	"strings"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// zoneFor classifies a network reached by a route (§1.8): external before
// shared before the owner comparison.
func zoneFor(owner, src string, n *inventory.Network) rowVal {
	switch {
	case n != nil && n.External:
		return rowVal{zone: schemas.ZoneExternal}
	case n != nil && n.Shared:
		return rowVal{zone: schemas.ZoneShared}
	case owner == src:
		return rowVal{zone: schemas.ZoneSameTenant, peer: owner}
	}
	return rowVal{zone: schemas.ZoneOtherTenant, peer: owner}
}

// resolve traces an extraroute of router r through its next hops and
// returns the zone of its destination (§1.8) as seen by tenant src ("":
// nobody's, so an owned network reads other_tenant with its owner). Every
// dead end is external: the safe billing direction.
func (b *builder) resolve(r *routerInfo, src string, dest netip.Prefix, nh netip.Addr) rowVal {
	ext := rowVal{zone: schemas.ZoneExternal}
	cur := r
	visited := map[string]bool{r.r.ID: true}
	for hop := 0; hop < b.opt.MaxRouteHops; hop++ {
		// A: the interface subnet of cur that holds the next hop
		var anchor *subnetInfo
		for _, f := range cur.ifaces {
			if f.sub.prefix.Contains(nh) && (anchor == nil || f.sub.prefix.Bits() > anchor.prefix.Bits()) {
				anchor = f.sub
			}
		}
		if anchor == nil {
			return ext
		}
		// B: the port holding the next hop on that subnet
		port := b.portsByIP[subnetAddr{anchor.s.ID, nh}]
		if port == nil {
			b.anomaly(AnomalyDanglingRoute, "router", r.r.ID, "route to %s: next hop %s matches no port", dest, nh)
			return ext
		}
		switch {
		case isRouterInterface(port.DeviceOwner):
			next := b.routers[port.DeviceID]
			if next == nil {
				return ext
			}
			if visited[next.r.ID] {
				b.anomaly(AnomalyCycle, "router", r.r.ID, "route to %s revisits router %s", dest, next.r.ID)
				return ext
			}
			visited[next.r.ID] = true
			// C: networks of next (other than the one we came in by) that
			// cover dest
			var best *subnetInfo
			owners := map[string]bool{}
			for _, f := range next.ifaces {
				s := f.sub
				if s.net == anchor.net || s.prefix.Addr().Is4() != dest.Addr().Is4() {
					continue
				}
				if s.prefix.Bits() <= dest.Bits() && s.prefix.Contains(dest.Addr()) {
					owners[s.net.Project()] = true
					if best == nil || s.prefix.Bits() > best.prefix.Bits() {
						best = s
					}
				}
			}
			if len(owners) > 1 {
				b.anomaly(AnomalyAmbiguity, "router", r.r.ID, "route to %s reaches networks of %d owners behind router %s", dest, len(owners), next.r.ID)
				return ext
			}
			if best != nil {
				return zoneFor(best.net.Project(), src, best.net)
			}
			// D: the longest route of next covering dest
			var via *inventory.Route
			bits := -1
			for i := range next.r.Routes {
				rt := &next.r.Routes[i]
				p, err := netip.ParsePrefix(strings.TrimSpace(rt.Destination))
				if err != nil || p.Addr().Is4() != dest.Addr().Is4() {
					continue
				}
				if p.Bits() <= dest.Bits() && p.Masked().Contains(dest.Addr()) && p.Bits() > bits {
					via, bits = rt, p.Bits()
				}
			}
			if via == nil {
				return ext // E
			}
			a, ok := parseAddr(via.NextHop)
			if !ok {
				return ext
			}
			cur, nh = next, a
		case strings.HasPrefix(port.DeviceOwner, "compute:"):
			// a VM appliance: the trace stops, beyond it is opaque
			return zoneFor(port.Project(), src, anchor.net)
		default:
			return ext
		}
	}
	b.anomaly(AnomalyMaxHops, "router", r.r.ID, "route to %s exceeds %d hops", dest, b.opt.MaxRouteHops)
	return ext
}
