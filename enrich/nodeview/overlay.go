package nodeview

import (
	"slices"
	"strings"

	"github.com/tapflow/tapflow/inventory"
)

// A node's view travels in two parts: the shared view (View(inv, ""),
// what every agent learns, one object for the whole fleet, with deltas as
// today) and the node's Overlay (its own records and the real ids of what
// they refer to, a few KiB). Merge(shared, overlay) is View(inv, node)
// exactly (TestOverlayMergesToView), and a change on one node changes the
// shared view and that node's overlay only.

// Overlay is what turns the shared view into one node's view.
type Overlay struct {
	Node string
	// Rename maps the pseudonyms of the node's ids back to them, sorted
	// by pseudonym (a slice, not a map: equal overlays encode equally).
	Rename []Rename
	// Replacements, by id (after Rename): the node's ports, amphorae and
	// trunks whole, its networks, subnets and routers with their names,
	// the load balancers with an amphora on it.
	Networks      []inventory.Network
	Subnets       []inventory.Subnet
	Ports         []inventory.Port
	Routers       []inventory.Router
	LoadBalancers []inventory.LoadBalancer
	Amphorae      []inventory.Amphora
	Trunks        []inventory.Trunk
	// Added: the shared view has none of these.
	Projects    []inventory.Project
	FloatingIPs []inventory.FloatingIP
	Servers     []inventory.Server
	Pools       []inventory.Pool
}

// HasVM reports whether the node has a VM-like port (an owner outside
// network:*): a network node's router and DHCP ports are no agent's VM
// side, and their overlay (about 0.9 KB a port) would exceed max_payload.
func (o *Overlay) HasVM() bool {
	for i := range o.Ports {
		if d := o.Ports[i].DeviceOwner; d != "" && !strings.HasPrefix(d, "network:") {
			return true
		}
	}
	return false
}

// Rename is one pseudonym and the id it stands for.
type Rename struct{ Pseudonym, ID string }

// Index answers Overlay for every node of one inventory in time
// proportional to the node's records, not the cloud's. Not safe for
// concurrent use (it remembers pseudonyms).
type Index struct {
	b      *Builder
	inv    *inventory.Inventory
	global *view // View(inv, ""): its keep set and pseudonyms
	shared *inventory.Inventory

	byHost   map[string][]int    // node → its ports
	subports map[string][]string // trunk parent port → subport ids
	port     map[string]int
	net      map[string]int
	sub      map[string]int
	router   map[string]int
	lb       map[string]int
	server   map[string]int
	project  map[string]int
	trunk    map[string][]int // parent port → trunks
	ampByDev map[string][]int // compute id → amphorae
	fipPort  map[string][]int // port → floating IPs
	poolLB   map[string][]int // load balancer → pools
	poolAddr map[string][]int // member address → pools
}

// NewIndex indexes inv (which it keeps and does not modify) and builds
// the shared view.
func (b *Builder) NewIndex(inv *inventory.Inventory) *Index {
	if inv == nil {
		inv = &inventory.Inventory{}
	}
	x := &Index{b: b, inv: inv, byHost: map[string][]int{}, subports: map[string][]string{}, port: map[string]int{}, net: map[string]int{},
		sub: map[string]int{}, router: map[string]int{}, lb: map[string]int{}, server: map[string]int{}, project: map[string]int{},
		trunk: map[string][]int{}, ampByDev: map[string][]int{}, fipPort: map[string][]int{}, poolLB: map[string][]int{}, poolAddr: map[string][]int{}}
	x.global = b.newView(inv)
	x.global.mark("")
	x.shared = x.global.render()
	for i := range inv.Ports {
		p := &inv.Ports[i]
		x.port[p.ID] = i
		if p.BindingHostID != "" {
			x.byHost[p.BindingHostID] = append(x.byHost[p.BindingHostID], i)
		}
	}
	for i := range inv.Trunks {
		t := &inv.Trunks[i]
		x.trunk[t.PortID] = append(x.trunk[t.PortID], i)
		for _, s := range t.SubPorts {
			x.subports[t.PortID] = append(x.subports[t.PortID], s.PortID)
		}
	}
	for i := range inv.Networks {
		x.net[inv.Networks[i].ID] = i
	}
	for i := range inv.Subnets {
		x.sub[inv.Subnets[i].ID] = i
	}
	for i := range inv.Routers {
		x.router[inv.Routers[i].ID] = i
	}
	for i := range inv.LoadBalancers {
		x.lb[inv.LoadBalancers[i].ID] = i
	}
	for i := range inv.Servers {
		x.server[inv.Servers[i].ID] = i
	}
	for i := range inv.Projects {
		x.project[inv.Projects[i].ID] = i
	}
	for i := range inv.Amphorae {
		c := inv.Amphorae[i].ComputeID
		x.ampByDev[c] = append(x.ampByDev[c], i)
	}
	for i := range inv.FloatingIPs {
		x.fipPort[inv.FloatingIPs[i].PortID] = append(x.fipPort[inv.FloatingIPs[i].PortID], i)
	}
	for i := range inv.Pools {
		p := &inv.Pools[i]
		for _, r := range p.LoadBalancers {
			x.poolLB[r.ID] = append(x.poolLB[r.ID], i)
		}
		for _, m := range p.Members {
			x.poolAddr[m.Address] = append(x.poolAddr[m.Address], i)
		}
	}
	return x
}

// Shared is the view every agent gets: View(inv, "").
func (x *Index) Shared() *inventory.Inventory { return x.shared }

// Nodes lists the nodes ports are bound to, sorted.
func (x *Index) Nodes() []string {
	out := make([]string, 0, len(x.byHost))
	for n := range x.byHost {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Overlay is node's overlay: Merge(x.Shared(), x.Overlay(node)) equals
// View(inv, node).
func (x *Index) Overlay(node string) *Overlay { return x.overlay(node, func(string) {}) }

// overlay is Overlay; dep is called with every key (node, id or address)
// under which it looks up a record of the inventory, the lookups that
// found nothing included: the overlay changes only if a record filed
// under one of them changes (see changedKeys), or the ids every view
// keeps do.
func (x *Index) overlay(node string, dep func(string)) *Overlay {
	inv := x.inv
	v := x.b.newView(inv)
	v.memo = x.global.memo
	mine := map[string]bool{}
	dep(node)
	// the ports: bound here, and the subports of their trunks
	var own []int
	for _, i := range x.byHost[node] {
		own = append(own, i)
		v.own[inv.Ports[i].ID] = true
	}
	for _, i := range x.byHost[node] {
		for _, s := range x.subports[inv.Ports[i].ID] {
			dep(s)
			if j, ok := x.port[s]; ok && !v.own[s] {
				v.own[s] = true
				own = append(own, j)
			}
		}
	}
	slices.Sort(own)
	keep := func(s string) {
		if s != "" && !x.global.kept[s] {
			mine[s] = true
		}
	}
	for _, i := range own {
		p := &inv.Ports[i]
		dep(p.ID)       // its record, trunks and floating IPs
		dep(p.DeviceID) // its amphorae
		dep(p.Project())
		keep(p.ID)
		keep(p.DeviceID)
		keep(p.NetworkID)
		for _, f := range p.FixedIPs {
			keep(f.SubnetID)
			v.localIPs[f.IPAddress] = true
			dep(f.IPAddress) // pools with a member there
		}
		for _, a := range p.AllowedAddressPairs {
			v.localIPs[a.IPAddress] = true
			dep(a.IPAddress)
		}
		for _, a := range x.ampByDev[p.DeviceID] {
			if lb := inv.Amphorae[a].LoadBalancerID; lb != "" {
				v.lbLocal[lb] = true
			}
		}
	}
	for _, i := range own {
		for _, f := range x.fipPort[inv.Ports[i].ID] {
			keep(inv.FloatingIPs[f].ID) // a floatingip port's device_id
		}
	}
	for lb := range v.lbLocal {
		dep(lb) // its record and pools
		if i, ok := x.lb[lb]; ok {
			keep(inv.LoadBalancers[i].VIPPortID)
		}
	}
	for m := range mine {
		dep(m) // network, subnet, router, server, amphorae, floating IPs
	}
	o := &Overlay{Node: node}
	rename := func(s string) { o.Rename = append(o.Rename, Rename{x.b.pseudonym(x.global.memo, s), s}) }
	for s := range mine {
		rename(s)
	}
	// the view with the node's keeps: v.id reads both sets
	v.keep = func(s string) bool { return x.global.kept[s] || mine[s] }
	for _, i := range own {
		o.Ports = append(o.Ports, wholePort(&inv.Ports[i]))
	}
	for _, m := range sortedKeys(mine) {
		if i, ok := x.net[m]; ok {
			n := &inv.Networks[i]
			o.Networks = append(o.Networks, inventory.Network{ID: n.ID, Name: n.Name, ProjectID: n.Project(), Shared: n.Shared, External: n.External})
		}
		if i, ok := x.sub[m]; ok {
			s := &inv.Subnets[i]
			o.Subnets = append(o.Subnets, inventory.Subnet{ID: s.ID, Name: s.Name, NetworkID: v.id(s.NetworkID), ProjectID: s.Project(), CIDR: s.CIDR, GatewayIP: s.GatewayIP, IPVersion: s.IPVersion})
		}
		if i, ok := x.router[m]; ok {
			r := v.router(&inv.Routers[i])
			o.Routers = append(o.Routers, r)
		}
		for _, a := range x.ampByDev[m] {
			o.Amphorae = append(o.Amphorae, inv.Amphorae[a])
			rename(inv.Amphorae[a].ID)
		}
		if i, ok := x.server[m]; ok {
			o.Servers = append(o.Servers, inv.Servers[i])
		}
	}
	for _, lb := range sortedKeys(v.lbLocal) {
		if i, ok := x.lb[lb]; ok {
			o.LoadBalancers = append(o.LoadBalancers, inv.LoadBalancers[i])
		}
	}
	var trunks, fips, pools, projects []int
	for _, i := range own {
		p := &inv.Ports[i]
		trunks = append(trunks, x.trunk[p.ID]...)
		if j, ok := x.project[p.Project()]; ok {
			projects = append(projects, j)
		}
		for _, ip := range p.FixedIPs {
			pools = append(pools, x.poolAddr[ip.IPAddress]...)
		}
		for _, a := range p.AllowedAddressPairs {
			pools = append(pools, x.poolAddr[a.IPAddress]...)
		}
	}
	for lb := range v.lbLocal {
		pools = append(pools, x.poolLB[lb]...)
	}
	for m := range mine {
		fips = append(fips, x.fipPort[m]...)
	}
	for _, i := range uniq(trunks) {
		t := inv.Trunks[i]
		t.SubPorts = slices.Clone(t.SubPorts)
		o.Trunks = append(o.Trunks, t)
		rename(t.ID)
	}
	for _, i := range uniq(fips) {
		o.FloatingIPs = append(o.FloatingIPs, inv.FloatingIPs[i])
	}
	for _, i := range uniq(projects) {
		o.Projects = append(o.Projects, inv.Projects[i])
	}
	slices.SortFunc(o.Servers, func(a, b inventory.Server) int { return x.server[a.ID] - x.server[b.ID] })
	for _, i := range uniq(pools) {
		if p, ok := v.pool(&inv.Pools[i]); ok {
			o.Pools = append(o.Pools, p)
		}
	}
	slices.SortFunc(o.Rename, func(a, b Rename) int { return strings.Compare(a.Pseudonym, b.Pseudonym) })
	o.Rename = slices.Compact(o.Rename)
	return o
}

func wholePort(p *inventory.Port) inventory.Port {
	o := *p
	o.FixedIPs = slices.Clone(p.FixedIPs)
	o.AllowedAddressPairs = slices.Clone(p.AllowedAddressPairs)
	return o
}

func uniq(s []int) []int {
	slices.Sort(s)
	return slices.Compact(s)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Merge is the node's view: shared with o's pseudonyms renamed, its
// records replaced and added. shared is not modified.
func Merge(shared *inventory.Inventory, o *Overlay) *inventory.Inventory {
	ids := make(map[string]string, len(o.Rename))
	for _, r := range o.Rename {
		ids[r.Pseudonym] = r.ID
	}
	r := func(s string) string {
		if id, ok := ids[s]; ok {
			return id
		}
		return s
	}
	out := &inventory.Inventory{}
	out.Networks = make([]inventory.Network, len(shared.Networks))
	for i, n := range shared.Networks {
		n.ID = r(n.ID)
		out.Networks[i] = n
	}
	out.Subnets = make([]inventory.Subnet, len(shared.Subnets))
	for i, s := range shared.Subnets {
		s.ID, s.NetworkID = r(s.ID), r(s.NetworkID)
		out.Subnets[i] = s
	}
	out.Ports = make([]inventory.Port, len(shared.Ports))
	for i, p := range shared.Ports {
		p.ID, p.NetworkID, p.DeviceID = r(p.ID), r(p.NetworkID), r(p.DeviceID)
		if len(p.FixedIPs) > 0 {
			f := make([]inventory.FixedIP, len(p.FixedIPs))
			for j, x := range p.FixedIPs {
				f[j] = inventory.FixedIP{SubnetID: r(x.SubnetID), IPAddress: x.IPAddress}
			}
			p.FixedIPs = f
		}
		p.AllowedAddressPairs = slices.Clone(p.AllowedAddressPairs)
		out.Ports[i] = p
	}
	out.Routers = make([]inventory.Router, len(shared.Routers))
	for i, rt := range shared.Routers {
		rt.ID = r(rt.ID)
		rt.Routes = slices.Clone(rt.Routes)
		if g := rt.ExternalGatewayInfo; g != nil {
			ng := &inventory.GatewayInfo{NetworkID: r(g.NetworkID)}
			for _, f := range g.ExternalFixedIPs {
				ng.ExternalFixedIPs = append(ng.ExternalFixedIPs, inventory.ExternalFixedIP{SubnetID: r(f.SubnetID), IPAddress: f.IPAddress})
			}
			rt.ExternalGatewayInfo = ng
		}
		out.Routers[i] = rt
	}
	out.LoadBalancers = make([]inventory.LoadBalancer, len(shared.LoadBalancers))
	for i, l := range shared.LoadBalancers {
		l.VIPPortID, l.VIPSubnetID, l.VIPNetworkID = r(l.VIPPortID), r(l.VIPSubnetID), r(l.VIPNetworkID)
		out.LoadBalancers[i] = l
	}
	out.Amphorae = make([]inventory.Amphora, len(shared.Amphorae))
	for i, a := range shared.Amphorae {
		a.ID, a.ComputeID = r(a.ID), r(a.ComputeID)
		out.Amphorae[i] = a
	}
	for _, t := range shared.Trunks {
		t.ID, t.PortID = r(t.ID), r(t.PortID)
		sp := make([]inventory.SubPort, len(t.SubPorts))
		for j, s := range t.SubPorts {
			s.PortID = r(s.PortID)
			sp[j] = s
		}
		t.SubPorts = sp
		out.Trunks = append(out.Trunks, t)
	}
	replace(out.Networks, o.Networks, func(n *inventory.Network) string { return n.ID })
	replace(out.Subnets, o.Subnets, func(n *inventory.Subnet) string { return n.ID })
	replace(out.Ports, o.Ports, func(n *inventory.Port) string { return n.ID })
	replace(out.Routers, o.Routers, func(n *inventory.Router) string { return n.ID })
	replace(out.LoadBalancers, o.LoadBalancers, func(n *inventory.LoadBalancer) string { return n.ID })
	replace(out.Amphorae, o.Amphorae, func(n *inventory.Amphora) string { return n.ID })
	replace(out.Trunks, o.Trunks, func(n *inventory.Trunk) string { return n.ID })
	out.Projects = append(slices.Clone(shared.Projects), o.Projects...)
	out.FloatingIPs = append(slices.Clone(shared.FloatingIPs), o.FloatingIPs...)
	out.Servers = append(slices.Clone(shared.Servers), o.Servers...)
	out.Pools = append(slices.Clone(shared.Pools), o.Pools...)
	return out
}

// replace puts each of with in place of the element of list with its id.
func replace[T any](list, with []T, id func(*T) string) {
	if len(with) == 0 {
		return
	}
	at := make(map[string]int, len(with))
	for i := range with {
		at[id(&with[i])] = i
	}
	for i := range list {
		if j, ok := at[id(&list[i])]; ok {
			list[i] = with[j]
		}
	}
}
