package lab

import (
	"net"
	"net/netip"
)

// Cloud is a resolved topology: every object with its IDs, MACs,
// addresses, namespace and device names. Resolve is deterministic, so the
// same topology and prefix always give the same cloud (that is how `lab
// drive` finds what `lab up` built).
type Cloud struct {
	Prefix   string
	Topology *Topology
	Projects []*Project
	Networks []*Network
	Ports    []*Port
	Routers  []*Router
	Servers  []*Server
	LBs      []*LB
	FIPs     []*FIP
	Internet *Internet
	// Hypervisors are the namespaces of the compute nodes beyond the
	// first (HVNS), in topology order.
	Hypervisors []string
	// Octavia's service project and management network (nil without LBs).
	ServiceProject *Project
	MgmtNet        *Network

	projects map[string]*Project
	networks map[string]*Network
	servers  map[string]*Server
	lbs      map[string]*LB
	routers  map[string]*Router
}

// Project is a Keystone project.
type Project struct{ Name, ID string }

// Network is a Neutron network and its bridge in the hypervisor namespace.
type Network struct {
	Name, ID string
	Project  *Project
	Shared   bool
	External bool
	Subnets  []*Subnet
	Bridge   string
	DHCP     *Port // network:dhcp port, or nil
}

// Subnet is a Neutron subnet.
type Subnet struct {
	ID      string
	Net     *Network
	Prefix  netip.Prefix
	Gateway netip.Addr // invalid: no gateway
	used    map[netip.Addr]string
	next    uint64
}

// FixedIP is one address of a port.
type FixedIP struct {
	Subnet *Subnet
	Addr   netip.Addr
}

// Port is a Neutron port. Instance ports (VMs, amphorae) are plugged into
// the hypervisor namespace through a veth whose host side is Tap
// ("tap"+id[:11], as Nova names it); router, DHCP and upstream ports use
// other host-side names, so only instance ports match the capture's tap*.
type Port struct {
	ID, Name    string
	Net         *Network
	MAC         net.HardwareAddr
	IPs         []FixedIP
	Owner       string // device_owner
	DeviceID    string
	Project     *Project         // nil: no project (router gateway)
	HostDev     string           // device in the hypervisor namespace ("" when not plugged)
	NS          string           // namespace of the other end
	Dev         string           // device name inside NS
	Inventory   bool             // written to the inventory file
	AddrPairs   []netip.Addr     // allowed address pairs with the port's MAC
	MACPairs    []MACPair        // allowed address pairs with their own MAC (topology allowed_address_pairs)
	WireMAC     net.HardwareAddr // the guest device's MAC when not the port's (nil: MAC)
	FIP         *FIP
	instance    bool
	serverIndex int
	hostNS      string // hypervisor namespace of HostDev ("": HVNS)
	// Subports make the port a trunk parent (TrunkID); a subport rides
	// its parent's tap (no HostDev of its own; Dev is the parent's).
	Subports []Subport
	TrunkID  string
}

// Subport is a trunk subport and its VLAN id.
type Subport struct {
	Port *Port
	VLAN int
}

// HostNS is the hypervisor namespace holding the port's host device.
func (p *Port) HostNS(c *Cloud) string {
	if p.hostNS != "" {
		return p.hostNS
	}
	return c.HVNS()
}

// MACPair is an allowed address pair with its own MAC.
type MACPair struct {
	Addr netip.Prefix
	MAC  net.HardwareAddr
}

// GuestMAC is the MAC the guest's device uses on the wire.
func (p *Port) GuestMAC() net.HardwareAddr {
	if p.WireMAC != nil {
		return p.WireMAC
	}
	return p.MAC
}

// Tap reports whether the port is an instance port seen by the capture.
func (p *Port) Tap() bool { return p.instance }

// V4 is the port's first IPv4 address (invalid when none).
func (p *Port) V4() netip.Addr { return p.first(true) }

// V6 is the port's first IPv6 address (invalid when none).
func (p *Port) V6() netip.Addr { return p.first(false) }

func (p *Port) first(v4 bool) netip.Addr {
	for _, ip := range p.IPs {
		if ip.Addr.Is4() == v4 {
			return ip.Addr
		}
	}
	return netip.Addr{}
}

// Router is a Neutron router: a namespace with qr-/qg- devices.
type Router struct {
	Name, ID string
	Project  *Project
	NS       string
	Gateway  *Network // nil: no external gateway
	GwPort   *Port
	Ifaces   []*Port
	Routes   []Route
	FIPs     []*FIP
}

// Route is an extraroute or in-guest route.
type Route struct {
	Dst     netip.Prefix
	NextHop netip.Addr
}

// Server is a Nova server (VM): a namespace with eth0.. ethN.
type Server struct {
	Name, ID string
	Project  *Project
	NS       string
	Ports    []*Port
	Routes   []Route
	Loopback []netip.Addr // on lo (an appliance's network behind it)
}

// LB is an Octavia load balancer with its amphorae.
type LB struct {
	Name, ID      string
	Project       *Project
	VIP           netip.Addr
	VIPSubnet     *Subnet
	VIPPort       *Port
	FIP           *FIP
	ActiveStandby bool
	Protocol      string // HTTP or TCP
	ListenPort    int
	Amphorae      []*Amphora
	Members       []*Member
	PoolID        string
	VRID          int
}

// Amphora is one amphora VM: a namespace running HAProxy (and keepalived
// for ACTIVE_STANDBY), with eth0 on the management network, eth1 on the
// VIP network and one more device per member network.
type Amphora struct {
	ID, ComputeID, Name string
	LB                  *LB
	NS                  string
	Role                string // MASTER, BACKUP or STANDALONE
	Mgmt, VRRP          *Port
	Ports               []*Port // eth0.. in order
}

// Member is a pool member.
type Member struct {
	ID           string
	Server       *Server
	Port         *Port
	Addr         netip.Addr
	Subnet       *Subnet
	ProtocolPort int
}

// FIP is a floating IP: DNAT/SNAT in its router's namespace.
type FIP struct {
	ID     string
	Addr   netip.Addr
	Net    *Network
	Port   *Port // the bound port (a VM port or an LB's VIP port)
	Fixed  netip.Addr
	Router *Router
	Holder *Port // the network:floatingip port
}

// Internet is the namespace beyond the external networks: it holds each
// external subnet's gateway address and the test servers' Addresses.
type Internet struct {
	NS        string
	Legs      []*Port
	Addresses []netip.Addr
}

// Namespace names. Everything a lab creates lives in namespaces named
// "<prefix>-…"; `lab down` finds them by that prefix.
func (c *Cloud) HVNS() string                { return c.Prefix + "-hv" }
func (c *Cloud) ns(kind, name string) string { return c.Prefix + "-" + kind + "-" + name }

// HypervisorNS is the namespace of hypervisor name ("" or "hv": the first).
func (c *Cloud) HypervisorNS(name string) string {
	if name == "" || name == "hv" {
		return c.HVNS()
	}
	return c.ns("hv", name)
}

// Namespaces lists every namespace of the lab, the hypervisors' first.
func (c *Cloud) Namespaces() []string {
	out := append([]string{c.HVNS()}, c.Hypervisors...)
	if c.Internet != nil {
		out = append(out, c.Internet.NS)
	}
	for _, r := range c.Routers {
		out = append(out, r.NS)
	}
	for _, n := range c.Networks {
		if n.DHCP != nil {
			out = append(out, n.DHCP.NS)
		}
	}
	for _, s := range c.Servers {
		out = append(out, s.NS)
	}
	for _, lb := range c.LBs {
		for _, a := range lb.Amphorae {
			out = append(out, a.NS)
		}
	}
	return out
}

// Taps are the instance ports' host devices (what the capture attaches to).
func (c *Cloud) Taps() []*Port {
	var out []*Port
	for _, p := range c.Ports {
		if p.instance {
			out = append(out, p)
		}
	}
	return out
}

// Server, LB, Network, Project and Router look objects up by name.
func (c *Cloud) Server(name string) *Server   { return c.servers[name] }
func (c *Cloud) LB(name string) *LB           { return c.lbs[name] }
func (c *Cloud) Network(name string) *Network { return c.networks[name] }
func (c *Cloud) Project(name string) *Project { return c.projects[name] }
func (c *Cloud) Router(name string) *Router   { return c.routers[name] }

// Amphora finds an amphora by its name (<lb>-amphora-<n>).
func (c *Cloud) Amphora(name string) *Amphora {
	for _, lb := range c.LBs {
		for _, a := range lb.Amphorae {
			if a.Name == name {
				return a
			}
		}
	}
	return nil
}

// PortByTap finds an instance port by its tap name.
func (c *Cloud) PortByTap(tap string) *Port {
	for _, p := range c.Ports {
		if p.instance && p.HostDev == tap {
			return p
		}
	}
	return nil
}

// ProjectByID finds a project by id.
func (c *Cloud) ProjectByID(id string) *Project {
	for _, p := range c.Projects {
		if p.ID == id {
			return p
		}
	}
	return nil
}
