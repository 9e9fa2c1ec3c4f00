// Package synth generates a realistic, deterministic inventory for
// benchmarks, the synthetic source and demos: tenants with routed private
// networks, DHCP and router ports, VMs with floating IPs, a shared network,
// and ACTIVE_STANDBY Octavia load balancers with their amphorae.
package synth

import (
	"fmt"

	"github.com/tapflow/tapflow/inventory"
)

// Options size the generated cloud.
type Options struct {
	Tenants          int // projects, each with one router and two networks of one subnet each
	VMsPerTenant     int // VM ports per tenant, spread over its two subnets
	LoadBalancers    int // ACTIVE_STANDBY amphora LBs, one per tenant from the first
	WithIPv6         bool
	ExternalNetworks int // public networks the routers' gateways are spread over (≥ 1)
	// FloatingIPsPerTenant: floating IPs on each tenant's first VMs (0: one).
	FloatingIPsPerTenant int
}

// Realistic is the size the attribution benchmark runs at: 1,000 tenants,
// 2,000 subnets, 10,000 VM ports, 100 load balancers.
var Realistic = Options{Tenants: 1000, VMsPerTenant: 10, LoadBalancers: 100, ExternalNetworks: 2}

// Fleet is the scale the metadata service is measured at (issue 13):
// 100,000 ports (60,000 VMs, 20,000 router interfaces, 20,000 DHCP),
// 10,000 routers, 50,000 floating IPs, 100 load balancers (+500 ports).
var Fleet = Options{Tenants: 10000, VMsPerTenant: 6, FloatingIPsPerTenant: 5, LoadBalancers: 100, ExternalNetworks: 4}

// Project, VMPort, RouterPort, ... name generated objects so callers can
// find them without searching.
func Project(t int) string { return fmt.Sprintf("tenant-%04d", t) }

// VMMAC is the MAC of VM v of tenant t.
func VMMAC(t, v int) string { return mac(0x10, t, v) }

// VMIP is the fixed IP of VM v of tenant t.
func VMIP(t, v int) string { return fmt.Sprintf("10.%d.%d.%d", 2*(t/250)+v%2, t%250, 10+v) }

// RouterMAC is the MAC of tenant t's router interface on subnet s (0 or 1).
func RouterMAC(t, s int) string { return mac(0x20, t, s) }

// AmphoraMAC is the MAC of the VIP-network data port of amphora a (0, 1)
// of load balancer l.
func AmphoraMAC(l, a int) string { return mac(0x30, l, a) }

// VIP is load balancer l's VIP.
func VIP(l int) string { return fmt.Sprintf("10.%d.%d.250", 2*(l/250), l%250) }

// AmphoraIP is the base address of amphora a of load balancer l.
func AmphoraIP(l, a int) string { return fmt.Sprintf("10.%d.%d.%d", 2*(l/250), l%250, 251+a) }

func mac(kind, a, b int) string {
	return fmt.Sprintf("fa:16:%02x:%02x:%02x:%02x", kind, a>>8&0xff, a&0xff, b&0xff)
}

// Generate builds the inventory.
func Generate(o Options) *inventory.Inventory {
	if o.ExternalNetworks < 1 {
		o.ExternalNetworks = 1
	}
	inv := &inventory.Inventory{}
	inv.Projects = append(inv.Projects, inventory.Project{ID: "admin", Name: "admin"}, inventory.Project{ID: "service", Name: "service"})
	for e := 0; e < o.ExternalNetworks; e++ {
		id := fmt.Sprintf("ext-%d", e)
		inv.Networks = append(inv.Networks, inventory.Network{ID: id, Name: fmt.Sprintf("public%d", e), ProjectID: "admin", External: true, Shared: true})
		inv.Subnets = append(inv.Subnets, inventory.Subnet{ID: id + "-v4", NetworkID: id, CIDR: fmt.Sprintf("203.0.%d.0/24", 100+e), GatewayIP: fmt.Sprintf("203.0.%d.1", 100+e), IPVersion: 4})
	}
	inv.Networks = append(inv.Networks,
		inventory.Network{ID: "shared", Name: "shared", ProjectID: "admin", Shared: true},
		inventory.Network{ID: "lb-mgmt", Name: "lb-mgmt", ProjectID: "service"})
	inv.Subnets = append(inv.Subnets,
		inventory.Subnet{ID: "shared-v4", NetworkID: "shared", CIDR: "100.64.0.0/16", GatewayIP: "100.64.0.1", IPVersion: 4},
		inventory.Subnet{ID: "lb-mgmt-v4", NetworkID: "lb-mgmt", CIDR: "172.31.0.0/16", GatewayIP: "172.31.0.1", IPVersion: 4})
	for t := 0; t < o.Tenants; t++ {
		p := Project(t)
		inv.Projects = append(inv.Projects, inventory.Project{ID: p, Name: p})
		rid := fmt.Sprintf("router-%d", t)
		ext := fmt.Sprintf("ext-%d", t%o.ExternalNetworks)
		inv.Routers = append(inv.Routers, inventory.Router{ID: rid, ProjectID: p, ExternalGatewayInfo: &inventory.GatewayInfo{NetworkID: ext}})
		for s := 0; s < 2; s++ {
			nid, sid := fmt.Sprintf("net-%d-%d", t, s), fmt.Sprintf("sub-%d-%d", t, s)
			cidr := fmt.Sprintf("10.%d.%d.0/24", 2*(t/250)+s, t%250)
			gw := fmt.Sprintf("10.%d.%d.1", 2*(t/250)+s, t%250)
			inv.Networks = append(inv.Networks, inventory.Network{ID: nid, Name: nid, ProjectID: p})
			inv.Subnets = append(inv.Subnets, inventory.Subnet{ID: sid, NetworkID: nid, ProjectID: p, CIDR: cidr, GatewayIP: gw, IPVersion: 4})
			ips := []inventory.FixedIP{{SubnetID: sid, IPAddress: gw}}
			if o.WithIPv6 {
				sid6 := sid + "-v6"
				inv.Subnets = append(inv.Subnets, inventory.Subnet{ID: sid6, NetworkID: nid, ProjectID: p, CIDR: fmt.Sprintf("fd%02x:%x:%x::/64", s, t/250, t%250), GatewayIP: fmt.Sprintf("fd%02x:%x:%x::1", s, t/250, t%250), IPVersion: 6})
				ips = append(ips, inventory.FixedIP{SubnetID: sid6, IPAddress: fmt.Sprintf("fd%02x:%x:%x::1", s, t/250, t%250)})
			}
			inv.Ports = append(inv.Ports,
				inventory.Port{ID: fmt.Sprintf("rif-%d-%d", t, s), NetworkID: nid, ProjectID: p, MACAddress: RouterMAC(t, s), DeviceOwner: "network:router_interface", DeviceID: rid, FixedIPs: ips},
				inventory.Port{ID: fmt.Sprintf("dhcp-%d-%d", t, s), NetworkID: nid, ProjectID: p, MACAddress: mac(0x40, t, s), DeviceOwner: "network:dhcp", DeviceID: "dhcp", FixedIPs: []inventory.FixedIP{{SubnetID: sid, IPAddress: fmt.Sprintf("10.%d.%d.2", 2*(t/250)+s, t%250)}}})
		}
		for v := 0; v < o.VMsPerTenant; v++ {
			s := v % 2
			pid := fmt.Sprintf("vm-%d-%d", t, v)
			inv.Ports = append(inv.Ports, inventory.Port{ID: pid, NetworkID: fmt.Sprintf("net-%d-%d", t, s), ProjectID: p, MACAddress: VMMAC(t, v), DeviceOwner: "compute:nova", DeviceID: "srv-" + pid,
				FixedIPs: []inventory.FixedIP{{SubnetID: fmt.Sprintf("sub-%d-%d", t, s), IPAddress: VMIP(t, v)}}})
			inv.Servers = append(inv.Servers, inventory.Server{ID: "srv-" + pid, Name: pid, TenantID: p})
			if v < max(o.FloatingIPsPerTenant, 1) {
				inv.FloatingIPs = append(inv.FloatingIPs, inventory.FloatingIP{ID: "fip-" + pid, FloatingNetworkID: ext, PortID: pid, ProjectID: p})
			}
		}
	}
	for l := 0; l < o.LoadBalancers && l < o.Tenants; l++ {
		p := Project(l)
		lb := fmt.Sprintf("lb-%d", l)
		nid, sid := fmt.Sprintf("net-%d-0", l), fmt.Sprintf("sub-%d-0", l)
		inv.LoadBalancers = append(inv.LoadBalancers, inventory.LoadBalancer{ID: lb, ProjectID: p, VIPAddress: VIP(l), VIPPortID: "vip-" + lb, VIPSubnetID: sid, Provider: "amphora"})
		inv.Ports = append(inv.Ports, inventory.Port{ID: "vip-" + lb, NetworkID: nid, ProjectID: p, MACAddress: mac(0x31, l, 0), DeviceOwner: "Octavia", DeviceID: "lb-" + lb,
			FixedIPs: []inventory.FixedIP{{SubnetID: sid, IPAddress: VIP(l)}}})
		for a := 0; a < 2; a++ {
			cid := fmt.Sprintf("amp-%d-%d", l, a)
			mgmt := fmt.Sprintf("172.31.%d.%d", l/250, 10+a+2*(l%120))
			role := []string{"MASTER", "BACKUP"}[a]
			inv.Amphorae = append(inv.Amphorae, inventory.Amphora{ID: cid, LoadBalancerID: lb, ComputeID: "nova-" + cid, LBNetworkIP: mgmt, VRRPIP: AmphoraIP(l, a), HAIP: VIP(l), Role: role, Status: "ALLOCATED"})
			inv.Ports = append(inv.Ports,
				inventory.Port{ID: cid + "-mgmt", NetworkID: "lb-mgmt", ProjectID: "service", MACAddress: mac(0x32, l, a), DeviceOwner: "compute:nova", DeviceID: "nova-" + cid,
					FixedIPs: []inventory.FixedIP{{SubnetID: "lb-mgmt-v4", IPAddress: mgmt}}},
				inventory.Port{ID: cid + "-vrrp", NetworkID: nid, ProjectID: "service", MACAddress: AmphoraMAC(l, a), DeviceOwner: "compute:nova", DeviceID: "nova-" + cid,
					FixedIPs: []inventory.FixedIP{{SubnetID: sid, IPAddress: AmphoraIP(l, a)}}, AllowedAddressPairs: []inventory.AddressPair{{IPAddress: VIP(l)}}})
		}
		var members []inventory.Member
		for v := 0; v < o.VMsPerTenant && v < 6; v += 2 {
			members = append(members, inventory.Member{ID: fmt.Sprintf("mem-%d-%d", l, v), Address: VMIP(l, v), ProtocolPort: 80, SubnetID: sid})
		}
		inv.Pools = append(inv.Pools, inventory.Pool{ID: "pool-" + lb, ProjectID: p, LoadBalancers: []inventory.LoadBalancerRef{{ID: lb}}, Members: members})
	}
	return inv
}
