package inventory

// interner makes equal strings share one copy. A cloud's objects repeat a
// few values many times (each port names its project, network, subnets
// and device owner), and a decoder allocates every occurrence: sharing
// them is most of what a port's decoded form costs beyond its own ids.
// Strings unique to an object (its id, MAC, addresses) are not interned:
// the table would cost more than it saves.
type interner map[string]string

func newInterner() interner { return interner{} }

func (in interner) s(p *string) {
	if *p == "" {
		return
	}
	if v, ok := in[*p]; ok {
		*p = v
		return
	}
	in[*p] = *p
}

func (in interner) network(o *Network) { in.s(&o.ProjectID); in.s(&o.TenantID) }

func (in interner) subnet(o *Subnet) {
	in.s(&o.NetworkID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
}

func (in interner) port(o *Port) {
	in.s(&o.NetworkID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
	in.s(&o.DeviceOwner)
	for i := range o.FixedIPs {
		in.s(&o.FixedIPs[i].SubnetID)
	}
	for i := range o.AllowedAddressPairs {
		in.s(&o.AllowedAddressPairs[i].IPAddress) // a VIP shared by the amphorae
	}
}

func (in interner) router(o *Router) {
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
	if g := o.ExternalGatewayInfo; g != nil {
		in.s(&g.NetworkID)
		for i := range g.ExternalFixedIPs {
			in.s(&g.ExternalFixedIPs[i].SubnetID)
		}
	}
}

func (in interner) floatingIP(o *FloatingIP) {
	in.s(&o.FloatingNetworkID)
	in.s(&o.RouterID)
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
}

func (in interner) server(o *Server) { in.s(&o.ProjectID); in.s(&o.TenantID) }

func (in interner) loadBalancer(o *LoadBalancer) {
	in.s(&o.ProjectID)
	in.s(&o.TenantID)
	in.s(&o.VIPSubnetID)
	in.s(&o.VIPNetworkID)
	in.s(&o.Provider)
	in.s(&o.ProvisioningStatus)
}

func (in interner) amphora(o *Amphora) {
	in.s(&o.LoadBalancerID)
	in.s(&o.Role)
	in.s(&o.Status)
}

func (in interner) pool(o *Pool) {
	in.s(&o.ProjectID)
	for i := range o.Members {
		in.s(&o.Members[i].SubnetID)
		in.s(&o.Members[i].ProjectID)
	}
}

func (in interner) trunk(o *Trunk) {
	in.s(&o.ProjectID)
	for i := range o.SubPorts {
		in.s(&o.SubPorts[i].SegmentationType)
	}
}

// intern shares the repeated strings of every object of inv.
func (inv *Inventory) intern(in interner) {
	for i := range inv.Networks {
		in.network(&inv.Networks[i])
	}
	for i := range inv.Subnets {
		in.subnet(&inv.Subnets[i])
	}
	for i := range inv.Ports {
		in.port(&inv.Ports[i])
	}
	for i := range inv.Routers {
		in.router(&inv.Routers[i])
	}
	for i := range inv.FloatingIPs {
		in.floatingIP(&inv.FloatingIPs[i])
	}
	for i := range inv.Servers {
		in.server(&inv.Servers[i])
	}
	for i := range inv.LoadBalancers {
		in.loadBalancer(&inv.LoadBalancers[i])
	}
	for i := range inv.Amphorae {
		in.amphora(&inv.Amphorae[i])
	}
	for i := range inv.Pools {
		in.pool(&inv.Pools[i])
	}
	for i := range inv.Trunks {
		in.trunk(&inv.Trunks[i])
	}
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
