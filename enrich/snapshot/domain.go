package snapshot

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// Domains: the addresses a VM can reach inside the cloud without leaving
// it. A VM port's domain is its own subnets plus every subnet attached to
// a router on them, and those routers' extraroutes (resolved through their
// next hops). Rows name the owner, not the viewer, so one domain serves
// every tenant with ports on the same subnets: at lookup an owner equal to
// the VM's tenant reads same_tenant, any other owner other_tenant. This is
// what makes traffic between projects joined by a router — a network
// shared through RBAC and attached to another project's router, or a
// router with interfaces in two projects' networks — other_tenant instead
// of the catch-all external.

// subnetRows are the rows one subnet contributes to a domain: the subnet
// by its network's owner (shared: shared; external: nothing, the catch-all
// applies), its infra hosts, and the addresses of ports on it that belong
// to another project than the network's (RBAC-shared networks).
func (b *builder) subnetRows(si *subnetInfo) []prow {
	if r, ok := b.subRows[si]; ok {
		return r
	}
	var out []prow
	n := si.net
	switch {
	case n.External:
	case n.Shared:
		out = append(out, prow{si.prefix, rowVal{zone: schemas.ZoneShared}})
	case n.Project() != "":
		out = append(out, prow{si.prefix, rowVal{zone: schemas.ZoneOtherTenant, peer: n.Project()}})
	}
	if !n.External {
		if si.gw.IsValid() {
			out = append(out, prow{netip.PrefixFrom(si.gw, si.gw.BitLen()), rowVal{zone: schemas.ZoneInfra}})
		}
		for _, p := range b.subnetPorts()[si.s.ID] {
			infra := IsInfraPort(p.DeviceOwner)
			tenant, vm := b.portTenant[p.ID]
			if !infra && (!vm || n.Shared || tenant == n.Project()) {
				continue
			}
			for _, f := range p.FixedIPs {
				if f.SubnetID != si.s.ID {
					continue
				}
				a, ok := parseAddr(f.IPAddress)
				if !ok || !si.prefix.Contains(a) {
					continue
				}
				v := rowVal{zone: schemas.ZoneInfra}
				if !infra {
					v = rowVal{zone: schemas.ZoneOtherTenant, peer: tenant}
				}
				out = append(out, prow{netip.PrefixFrom(a, a.BitLen()), v})
			}
		}
	}
	b.subRows[si] = out
	return out
}

// subnetPorts indexes ports by the subnets of their fixed IPs.
func (b *builder) subnetPorts() map[string][]*inventory.Port {
	if b.subPorts == nil {
		b.subPorts = map[string][]*inventory.Port{}
		for i := range b.inv.Ports {
			p := &b.inv.Ports[i]
			for _, f := range p.FixedIPs {
				if l := b.subPorts[f.SubnetID]; len(l) == 0 || l[len(l)-1] != p {
					b.subPorts[f.SubnetID] = append(l, p)
				}
			}
		}
	}
	return b.subPorts
}

// routerRouteRows are a router's extraroutes resolved for nobody in
// particular (owners, not viewers).
func (b *builder) routerRouteRows(ri *routerInfo) []prow {
	if r, ok := b.rtRows[ri]; ok {
		return r
	}
	var out []prow
	for _, rt := range ri.r.Routes {
		dest, err := netip.ParsePrefix(strings.TrimSpace(rt.Destination))
		if err != nil || dest.Addr().Zone() != "" {
			continue // routeRows reports it
		}
		nh, ok := parseAddr(rt.NextHop)
		if !ok || nh.Is4() != dest.Addr().Is4() {
			continue
		}
		out = append(out, prow{dest.Masked(), b.resolve(ri, "", dest.Masked(), nh)})
	}
	b.rtRows[ri] = out
	return out
}

// domainRows builds one domain per distinct set of port subnets, points
// every endpoint at its domain, and writes the addresses of foreign ports
// on a tenant's own networks into that tenant's table.
func (b *builder) domainRows(eps map[uint64]*Endpoint) {
	keys := map[string][]*subnetInfo{}
	for i := range b.inv.Ports {
		p := &b.inv.Ports[i]
		if _, ok := b.portTenant[p.ID]; !ok {
			continue
		}
		k, subs := b.portDomain(p.ID)
		if k != "" {
			keys[k] = subs
		}
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	for _, k := range sorted {
		m := map[netip.Prefix]rowVal{}
		seen := map[*subnetInfo]bool{}
		add := func(si *subnetInfo) {
			if seen[si] {
				return
			}
			seen[si] = true
			for _, r := range b.subnetRows(si) {
				putRow(m, r.p, r.v)
			}
		}
		for _, si := range keys[k] {
			add(si)
			for _, ri := range b.attached(si) {
				for _, f := range ri.ifaces {
					add(f.sub)
				}
				for _, r := range b.routerRouteRows(ri) {
					putRow(m, r.p, r.v)
				}
			}
		}
		b.domainIdx[k] = uint32(len(b.drows))
		b.drows = append(b.drows, m)
		owners := map[string]bool{}
		for _, v := range m {
			if v.zone == schemas.ZoneOtherTenant {
				owners[v.peer] = true
			}
		}
		b.downers = append(b.downers, owners)
	}
	used := make([]bool, len(b.drows))
	for _, e := range eps {
		e.domain = b.domainFor(e)
		used[e.domain] = true
	}
	for _, e := range b.vlanEPs {
		if e != nil {
			e.domain = b.domainFor(e)
			used[e.domain] = true
		}
	}
	for i := 1; i < len(b.drows); i++ {
		if !used[i] {
			b.drows[i] = nil // no endpoint needs it: not flattened
		}
	}
	// a tenant's own subnet holding another project's port (RBAC): that
	// address is the other project's in the owner's view too
	for _, id := range slices.Sorted(maps.Keys(b.subnets)) {
		si := b.subnets[id]
		if si.net.Shared || si.net.External || si.net.Project() == "" {
			continue
		}
		owner := b.intern(si.net.Project())
		for _, r := range b.subnetRows(si) {
			if r.v.zone == schemas.ZoneOtherTenant && r.p.IsSingleIP() {
				b.addRow(owner, r.p, r.v)
			}
		}
	}
}

// domainFor is e's domain, or 0 when it names no project but e's own:
// then the tenant's table already says everything it would (and the hot
// path saves a lookup).
func (b *builder) domainFor(e *Endpoint) uint32 {
	d := b.domainIdx[e.domainKey]
	if d == 0 {
		return 0
	}
	for o := range b.downers[d] {
		if o != e.TenantID {
			return d
		}
	}
	return 0
}

// portDomain is the domain key of a port and its subnets.
func (b *builder) portDomain(portID string) (string, []*subnetInfo) {
	subs := slices.Clone(b.portSubs[portID])
	slices.SortFunc(subs, func(x, y *subnetInfo) int { return strings.Compare(x.s.ID, y.s.ID) })
	subs = slices.Compact(subs)
	ids := make([]string, len(subs))
	for i, si := range subs {
		ids[i] = si.s.ID
	}
	return strings.Join(ids, ","), subs
}
