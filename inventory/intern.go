package inventory

import (
	"strings"
	"unsafe"
)

// interner makes equal strings share one copy. A cloud's objects repeat a
// few values many times (each port names its project, network, subnets
// and device owner), and a decoder allocates every occurrence: sharing
// them is most of what a port's decoded form costs beyond its own ids.
// Strings unique to an object (its id, MAC, addresses) are not interned,
// the table would cost more than it saves: they are packed instead, the
// strings of a few hundred objects into one allocation (a 36-byte UUID is
// a 48-byte allocation on its own, a MAC 24).
type interner struct {
	m     map[string]string
	chunk []byte    // keep's current chunk
	uniq  []*string // strings to pack at the next pack
	// Ports come before floating IPs and servers (in the file and in
	// intern): a floating IP's port_id and a server's id then share the
	// port's id and device_id instead of a copy each.
	portIDs, deviceIDs map[string]string
	packed             []*Port // ports marked since the last pack
	// fixed are the ports' fixed_ips lists, packed into one array too:
	// each its own small allocation, they were spread over pages the
	// decoder's garbage had otherwise emptied
	fixed []*[]FixedIP
	gws   []**GatewayInfo // routers' gateways, packed into one array too
}

// packEvery is how many objects' unique strings share one allocation.
const packEvery = 256

func newInterner() *interner {
	return &interner{m: map[string]string{}, portIDs: map[string]string{}, deviceIDs: map[string]string{}}
}

// u marks a string unique to its object, to pack.
func (in *interner) u(p *string) {
	if *p != "" {
		in.uniq = append(in.uniq, p)
	}
}

// pack copies the strings marked since the last pack into one allocation.
func (in *interner) pack() {
	n := 0
	for _, p := range in.uniq {
		n += len(*p)
	}
	if n > 0 {
		buf := make([]byte, 0, n)
		for _, p := range in.uniq {
			buf = append(buf, *p...)
		}
		all := string(buf)
		off := 0
		for _, p := range in.uniq {
			l := len(*p)
			*p = all[off : off+l]
			off += l
		}
	}
	clear(in.uniq)
	in.uniq = in.uniq[:0]
	for _, p := range in.packed {
		in.portIDs[p.ID] = p.ID
		if p.DeviceID != "" && vmOwner(p.DeviceOwner) {
			in.deviceIDs[p.DeviceID] = p.DeviceID
		}
	}
	clear(in.packed)
	in.packed = in.packed[:0]
	nf := 0
	for _, f := range in.fixed {
		nf += len(*f)
	}
	ips := make([]FixedIP, 0, nf)
	for _, f := range in.fixed {
		lo := len(ips)
		ips = append(ips, *f...)
		*f = ips[lo:len(ips):len(ips)] // full: an append copies, never overwrites the next port's
	}
	clear(in.fixed)
	in.fixed = in.fixed[:0]
	if len(in.gws) > 0 {
		gws := make([]GatewayInfo, len(in.gws))
		for i, g := range in.gws {
			gws[i] = **g
			*g = &gws[i]
		}
		clear(in.gws)
		in.gws = in.gws[:0]
	}
}

// vmOwner: a port device_owner of a Nova instance (any owner outside
// network:*).
func vmOwner(owner string) bool { return owner != "" && !strings.HasPrefix(owner, "network:") }

// shared points *p at the copy m holds, else marks it unique.
func (in *interner) shared(m map[string]string, p *string) {
	if v, ok := m[*p]; ok {
		*p = v
		return
	}
	in.u(p)
}

func (in *interner) s(p *string) {
	if *p == "" {
		return
	}
	if v, ok := in.m[*p]; ok {
		*p = v
		return
	}
	v := in.keep(*p)
	in.m[v] = v
	*p = v
}

// keep copies v into the interner's current chunk. The first copy of a
// shared value would otherwise be the decoder's, one small string amid
// thousands the decoder made and dropped: a page stays in use for it.
func (in *interner) keep(v string) string {
	if len(v) > internChunk/4 {
		return strings.Clone(v)
	}
	if cap(in.chunk)-len(in.chunk) < len(v) {
		in.chunk = make([]byte, 0, internChunk)
	}
	off := len(in.chunk)
	in.chunk = append(in.chunk, v...)
	// the bytes are never written again: the chunk only grows
	return unsafe.String(&in.chunk[off], len(v))
}

// internChunk is the size of the interner's string chunks.
const internChunk = 16 << 10

func (in *interner) project(o *Project) { in.u(&o.ID); in.u(&o.Name) }

func (in *interner) network(o *Network) {
	in.u(&o.ID)
	in.u(&o.Name)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
}

func (in *interner) subnet(o *Subnet) {
	in.u(&o.ID)
	in.u(&o.Name)
	in.u(&o.CIDR)
	in.u(&o.GatewayIP)
	in.s(&o.NetworkID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
}

func (in *interner) port(o *Port) {
	in.packed = append(in.packed, o)
	if len(o.FixedIPs) > 0 {
		in.fixed = append(in.fixed, &o.FixedIPs)
	}
	in.u(&o.ID)
	in.u(&o.Name)
	in.u(&o.MACAddress)
	in.u(&o.DeviceID)
	in.s(&o.NetworkID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
	in.s(&o.DeviceOwner)
	in.s(&o.BindingHostID) // a few hundred nodes
	for i := range o.FixedIPs {
		in.s(&o.FixedIPs[i].SubnetID)
		in.u(&o.FixedIPs[i].IPAddress)
	}
	for i := range o.AllowedAddressPairs {
		in.s(&o.AllowedAddressPairs[i].IPAddress) // a VIP shared by the amphorae
		in.u(&o.AllowedAddressPairs[i].MACAddress)
	}
}

func (in *interner) router(o *Router) {
	in.u(&o.ID)
	in.u(&o.Name)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
	if g := o.ExternalGatewayInfo; g != nil {
		in.s(&g.NetworkID)
		for i := range g.ExternalFixedIPs {
			in.s(&g.ExternalFixedIPs[i].SubnetID)
			in.u(&g.ExternalFixedIPs[i].IPAddress)
		}
		in.gws = append(in.gws, &o.ExternalGatewayInfo)
	}
	for i := range o.Routes {
		in.u(&o.Routes[i].Destination)
		in.u(&o.Routes[i].NextHop)
	}
}

func (in *interner) floatingIP(o *FloatingIP) {
	in.u(&o.ID)
	in.u(&o.FloatingIPAddress)
	in.shared(in.portIDs, &o.PortID)
	in.u(&o.FixedIPAddress)
	in.s(&o.FloatingNetworkID)
	in.s(&o.RouterID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
}

func (in *interner) server(o *Server) {
	in.shared(in.deviceIDs, &o.ID)
	in.u(&o.Name)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
}

func (in *interner) loadBalancer(o *LoadBalancer) {
	in.u(&o.ID)
	in.u(&o.Name)
	in.u(&o.VIPAddress)
	in.u(&o.VIPPortID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
	in.s(&o.VIPSubnetID)
	in.s(&o.VIPNetworkID)
	in.s(&o.Provider)
	in.s(&o.ProvisioningStatus)
}

func (in *interner) amphora(o *Amphora) {
	in.u(&o.ID)
	in.u(&o.ComputeID)
	in.u(&o.LBNetworkIP)
	in.u(&o.VRRPIP)
	in.u(&o.HAIP)
	in.u(&o.VRRPPortID)
	in.u(&o.HAPortID)
	in.s(&o.LoadBalancerID)
	in.s(&o.Role)
	in.s(&o.Status)
}

func (in *interner) pool(o *Pool) {
	in.u(&o.ID)
	in.u(&o.Name)
	in.s(&o.ProjectID)
	for i := range o.LoadBalancers {
		in.s(&o.LoadBalancers[i].ID)
	}
	for i := range o.Members {
		in.u(&o.Members[i].ID)
		in.u(&o.Members[i].Name)
		in.u(&o.Members[i].Address)
		in.s(&o.Members[i].SubnetID)
		in.s(&o.Members[i].ProjectID)
	}
}

func (in *interner) trunk(o *Trunk) {
	in.u(&o.ID)
	in.u(&o.Name)
	in.s(&o.ProjectID)
	in.u(&o.PortID)
	for i := range o.SubPorts {
		in.u(&o.SubPorts[i].PortID)
		in.s(&o.SubPorts[i].SegmentationType)
	}
}

// intern shares the repeated strings of every object of inv and packs
// the unique ones.
func (inv *Inventory) intern(in *interner) {
	each(in, inv.Projects, in.project)
	each(in, inv.Networks, in.network)
	each(in, inv.Subnets, in.subnet)
	each(in, inv.Ports, in.port)
	each(in, inv.Routers, in.router)
	each(in, inv.FloatingIPs, in.floatingIP)
	each(in, inv.Servers, in.server)
	each(in, inv.LoadBalancers, in.loadBalancer)
	each(in, inv.Amphorae, in.amphora)
	each(in, inv.Pools, in.pool)
	each(in, inv.Trunks, in.trunk)
}

func each[T any](in *interner, objs []T, f func(*T)) {
	for i := range objs {
		f(&objs[i])
		if (i+1)%packEvery == 0 {
			in.pack()
		}
	}
	in.pack()
}

// Compact makes equal strings of inv share one copy, in place, and returns
// inv: for an inventory decoded by other means than Parse (the NATS
// snapshot), which Parse and Load already do.
func Compact(inv *Inventory) *Inventory {
	if inv != nil {
		inv.intern(newInterner())
	}
	return inv
}
