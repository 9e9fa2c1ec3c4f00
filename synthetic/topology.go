package synthetic

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
)

// endpoint is one tap: a VM port, an amphora data port or a port the
// inventory does not know. Every string is built once, so flows only copy
// string headers.
type endpoint struct {
	ifname, mac, ip string
	// the subnet's plumbing as the VM sees it
	routerMAC, gatewayIP, dhcpMAC, dhcpIP string
	// expected attribution of the tap
	tenant, server, port, lbID string
	tenantIdx                  int
	fip                        bool // the port has a floating IP
	// exitLabel is the external network of records that leave through the
	// subnet's router; fallbackLabel that of records whose next hop is not
	// a known router (the port's floating IP network, else the network of
	// the router holding the subnet gateway).
	exitLabel, fallbackLabel string
}

type loadBalancer struct {
	id      string
	owner   int    // tenant index
	vip     string // VIP address
	amps    [2]endpoint
	members []int // indices into topology.vms
}

// topology is the generated cloud as the generator needs it.
type topology struct {
	inv      *inventory.Inventory
	tenants  int
	vmsPer   int
	projects []string
	vms      []endpoint // tenant t, VM v at t*vmsPer+v
	lbs      []loadBalancer
	unknown  []endpoint // taps of ports missing from the inventory
	internet []string   // remote hosts outside the cloud
	shared   []string   // hosts on the shared network
}

const (
	internetHosts = 4096
	sharedHosts   = 1024
)

// tapName is Nova's tap device name for a port: "tap" + the first 11
// characters of the port id.
func tapName(portID string) string {
	if len(portID) > 11 {
		portID = portID[:11]
	}
	return "tap" + portID
}

// buildTopology generates the inventory with inventory/synth and
// reads back from it, object by object, everything the generator emits and
// expects. The expectations come from the inventory's meaning (ports,
// routers, floating IPs, load balancers), not from the snapshot code, so
// the enrich agreement test checks one against the other.
func buildTopology(c Config) (*topology, error) {
	inv := synth.Generate(synth.Options{
		Tenants: c.Tenants, VMsPerTenant: c.VMsPerTenant, LoadBalancers: c.LoadBalancers, ExternalNetworks: c.ExternalNetworks,
	})
	tp := &topology{inv: inv, tenants: c.Tenants, vmsPer: c.VMsPerTenant}

	networks := map[string]*inventory.Network{}
	for i := range inv.Networks {
		networks[inv.Networks[i].ID] = &inv.Networks[i]
	}
	label := func(netID string) string {
		if n := networks[netID]; n != nil && n.Name != "" {
			return n.Name
		}
		return netID
	}
	routerLabel := map[string]string{}
	for i := range inv.Routers {
		r := &inv.Routers[i]
		if gw := r.GatewayNetworkID(); gw != "" {
			routerLabel[r.ID] = label(gw)
		}
	}
	type subnet struct {
		gw, routerMAC, routerID, gwRouterID, dhcpMAC, dhcpIP string
	}
	subnets := map[string]*subnet{}
	for i := range inv.Subnets {
		subnets[inv.Subnets[i].ID] = &subnet{gw: inv.Subnets[i].GatewayIP}
	}
	ports := map[string]*inventory.Port{} // by MAC
	fipLabel := map[string]string{}       // by port id
	for i := range inv.FloatingIPs {
		f := &inv.FloatingIPs[i]
		fipLabel[f.PortID] = label(f.FloatingNetworkID)
	}
	for i := range inv.Ports {
		p := &inv.Ports[i]
		ports[strings.ToLower(p.MACAddress)] = p
		for _, f := range p.FixedIPs {
			s := subnets[f.SubnetID]
			if s == nil {
				continue
			}
			switch p.DeviceOwner {
			case "network:dhcp":
				s.dhcpMAC, s.dhcpIP = p.MACAddress, f.IPAddress
			case "network:router_interface":
				s.routerMAC, s.routerID = p.MACAddress, p.DeviceID
				if f.IPAddress == s.gw {
					s.gwRouterID = p.DeviceID
				}
			}
		}
	}
	port := func(mac string) (*inventory.Port, *subnet, error) {
		p := ports[mac]
		if p == nil || len(p.FixedIPs) == 0 {
			return nil, nil, fmt.Errorf("generated inventory has no port with MAC %s and a fixed IP (inventory/synth changed?)", mac)
		}
		s := subnets[p.FixedIPs[0].SubnetID]
		if s == nil || s.routerMAC == "" || s.dhcpMAC == "" {
			return nil, nil, fmt.Errorf("port %s: subnet %s has no router interface or DHCP port (inventory/synth changed?)", p.ID, p.FixedIPs[0].SubnetID)
		}
		return p, s, nil
	}
	ep := func(p *inventory.Port, s *subnet) endpoint {
		fallback := fipLabel[p.ID]
		if fallback == "" {
			fallback = routerLabel[s.gwRouterID]
		}
		return endpoint{
			ifname: tapName(p.ID), mac: p.MACAddress, ip: p.FixedIPs[0].IPAddress,
			routerMAC: s.routerMAC, gatewayIP: s.gw, dhcpMAC: s.dhcpMAC, dhcpIP: s.dhcpIP,
			tenant: p.Project(), server: p.DeviceID, port: p.ID,
			exitLabel: routerLabel[s.routerID], fallbackLabel: fallback, fip: fipLabel[p.ID] != "",
		}
	}

	byIP := map[string]int{}
	projectIdx := map[string]int{}
	for t := range c.Tenants {
		tp.projects = append(tp.projects, synth.Project(t))
		projectIdx[synth.Project(t)] = t
		for v := range c.VMsPerTenant {
			p, s, err := port(synth.VMMAC(t, v))
			if err != nil {
				return nil, err
			}
			e := ep(p, s)
			e.tenantIdx = t
			byIP[e.ip] = len(tp.vms)
			tp.vms = append(tp.vms, e)
		}
	}
	for l := range c.LoadBalancers {
		lb := &inv.LoadBalancers[l]
		owner, ok := projectIdx[lb.Project()]
		if !ok || lb.VIPAddress != synth.VIP(l) {
			return nil, fmt.Errorf("load balancer %s: owner %q or VIP %q not as generated (inventory/synth changed?)", lb.ID, lb.Project(), lb.VIPAddress)
		}
		b := loadBalancer{id: lb.ID, owner: owner, vip: lb.VIPAddress}
		for a := range 2 {
			p, s, err := port(synth.AmphoraMAC(l, a))
			if err != nil {
				return nil, err
			}
			e := ep(p, s)
			e.tenant, e.tenantIdx, e.lbID = lb.Project(), owner, lb.ID
			if !e.fip && fipLabel[lb.VIPPortID] != "" { // the VIP's floating IP is the amphora's too
				e.fallbackLabel = fipLabel[lb.VIPPortID]
			}
			b.amps[a] = e
		}
		for i := range inv.Pools {
			pl := &inv.Pools[i]
			if len(pl.LoadBalancers) == 0 || pl.LoadBalancers[0].ID != lb.ID {
				continue
			}
			for _, m := range pl.Members {
				if vi, ok := byIP[m.Address]; ok && tp.vms[vi].tenantIdx == owner {
					b.members = append(b.members, vi)
				}
			}
		}
		if len(b.members) == 0 {
			return nil, fmt.Errorf("load balancer %s: no member VM found in its pool", lb.ID)
		}
		tp.lbs = append(tp.lbs, b)
	}

	// Ports booted after the last inventory poll: one per 50 VMs, in tenant
	// i mod tenants, at .254 or .253 of its first or second network (free
	// in synth's plan: VMs use .10–.249, Octavia .250–.252).
	subnets2 := min(2, c.VMsPerTenant) // VM 1 is on the second network
	nUnknown := max(1, min(1024, len(tp.vms)/50, 2*subnets2*c.Tenants))
	for i := range nUnknown {
		slot := i / c.Tenants
		owner := &tp.vms[(i%c.Tenants)*c.VMsPerTenant+slot%subnets2]
		b := netip.MustParseAddr(owner.ip).As4()
		b[3] = byte(254 - slot/subnets2)
		mac := fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff)
		if ports[mac] != nil {
			return nil, fmt.Errorf("unknown-port MAC %s is in the generated inventory", mac)
		}
		id := fmt.Sprintf("%08x-5eed-4e00-8000-%012x", 0xd0000000+i, i)
		tp.unknown = append(tp.unknown, endpoint{
			ifname: tapName(id), mac: mac, ip: netip.AddrFrom4(b).String(),
			routerMAC: owner.routerMAC, gatewayIP: owner.gatewayIP, dhcpMAC: owner.dhcpMAC, dhcpIP: owner.dhcpIP,
			tenantIdx: -1,
		})
	}
	// 198.18.0.0/15 (benchmarking range): never a cloud address.
	for i := range internetHosts {
		tp.internet = append(tp.internet, netip.AddrFrom4([4]byte{198, 18 + byte(i>>14), byte(i >> 6), byte(1 + i&63)}).String())
	}
	tp.internet[0], tp.internet[1] = "8.8.8.8", "1.1.1.1" // resolvers, for DNS flows
	// hosts on the shared network's subnet, away from .0/.1/.255
	var shared netip.Prefix
	for i := range inv.Subnets {
		s := &inv.Subnets[i]
		if n := networks[s.NetworkID]; n != nil && n.Shared && !n.External {
			if p, err := netip.ParsePrefix(s.CIDR); err == nil && p.Addr().Is4() && p.Bits() <= 16 {
				shared = p.Masked()
			}
		}
	}
	if !shared.IsValid() {
		return nil, fmt.Errorf("generated inventory has no shared IPv4 network of /16 or more (inventory/synth changed?)")
	}
	for i := range sharedHosts {
		b := shared.Addr().As4()
		b[2], b[3] = b[2]+byte(1+i/250), byte(2+i%250)
		tp.shared = append(tp.shared, netip.AddrFrom4(b).String())
	}
	return tp, nil
}
