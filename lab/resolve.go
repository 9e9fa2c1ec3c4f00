package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ---------------------------------------------------------------- ids

func digest(parts ...string) []byte {
	h := sha256.Sum256([]byte("tapflow-lab\x00" + strings.Join(parts, "\x00")))
	return h[:]
}

// uuid derives a stable UUID-shaped id (version 8, "custom").
func uuid(parts ...string) string {
	b := digest(parts...)[:16]
	b[6] = b[6]&0x0f | 0x80
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// projectID is a Keystone-style 32-hex id.
func projectID(name string) string { return hex.EncodeToString(digest("project", name)[:16]) }

// portMAC is an fa:16:3e MAC (Neutron's default base) derived from the id.
func portMAC(id string) net.HardwareAddr {
	d := digest("mac", id)
	return net.HardwareAddr{0xfa, 0x16, 0x3e, d[0], d[1], d[2]}
}

// ---------------------------------------------------------------- resolve

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)
)

// Defaults.
const (
	AdminProject        = "admin"
	DefaultServiceProj  = "octavia-service"
	DefaultMgmtCIDR     = "172.31.0.0/24"
	DefaultInternetAddr = "198.51.100.10"
	MetadataAddr        = "169.254.169.254"
	TCPPort             = 5001 // lab server: TCP and UDP
	HTTPPort            = 8080 // lab server: HTTP
	MetadataPort        = 9697 // metadata responder in router namespaces (nft redirect from :80)
	DHCPPort            = 67
)

type resolver struct {
	t        *Topology
	c        *Cloud
	errs     []string
	fipSpecs []fipReq
	pending  []pendingAlloc // auto-allocations, done after every explicit address is claimed
}

func (r *resolver) fail(path, name, format string, args ...any) {
	r.errs = append(r.errs, r.t.where(path, name)+": "+fmt.Sprintf(format, args...))
}

// ValidPrefix checks a lab prefix: a lowercase letter, then up to 11
// lowercase letters or digits (namespaces are "<prefix>-…").
func ValidPrefix(p string) error {
	if !prefixRE.MatchString(p) {
		return fmt.Errorf("lab prefix %q: use a lowercase letter followed by up to 11 lowercase letters or digits (e.g. tfl)", p)
	}
	return nil
}

// Resolve checks the topology and derives every object. All problems are
// reported at once, each with the file, line and object; nothing is
// created.
func Resolve(t *Topology, prefix string) (*Cloud, error) {
	if err := ValidPrefix(prefix); err != nil {
		return nil, err
	}
	c := &Cloud{Prefix: prefix, Topology: t, projects: map[string]*Project{}, networks: map[string]*Network{},
		servers: map[string]*Server{}, lbs: map[string]*LB{}, routers: map[string]*Router{}}
	r := &resolver{t: t, c: c}
	r.projects()
	r.networks()
	if len(r.errs) == 0 {
		r.internet()
		r.routers()
		r.dhcp()
		r.hypervisors()
		r.servers()
		r.lbs()
		r.fips()
		r.allocate()
		r.checkUnique()
	}
	if len(r.errs) > 0 {
		return nil, fmt.Errorf("lab topology %s is invalid (nothing was created):\n  %s", t.file, strings.Join(r.errs, "\n  "))
	}
	return c, nil
}

func (r *resolver) project(path, obj, name string) *Project {
	if name == "" {
		r.fail(path, obj, "project: missing; use one of the names under projects:")
		return nil
	}
	p := r.c.projects[name]
	if p == nil {
		r.fail(path, obj, "project %q is not defined; defined: %s", name, strings.Join(keys(r.c.projects), ", "))
	}
	return p
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (r *resolver) addProject(name string) *Project {
	p := &Project{Name: name, ID: projectID(name)}
	r.c.projects[name] = p
	r.c.Projects = append(r.c.Projects, p)
	return p
}

func (r *resolver) projects() {
	for i, name := range r.t.Projects {
		path := fmt.Sprintf("projects[%d]", i)
		switch {
		case !nameRE.MatchString(name):
			r.fail(path, name, "project name must match %s", nameRE)
		case r.c.projects[name] != nil:
			r.fail(path, name, "duplicate project name")
		default:
			r.addProject(name)
		}
	}
	if r.c.projects[AdminProject] == nil {
		r.addProject(AdminProject)
	}
	if len(r.t.LoadBalancers) > 0 {
		svc := r.t.Octavia.Project
		if svc == "" {
			svc = DefaultServiceProj
		}
		if r.c.ServiceProject = r.c.projects[svc]; r.c.ServiceProject == nil {
			r.c.ServiceProject = r.addProject(svc)
		}
	}
}

func (r *resolver) newSubnet(path, obj string, n *Network, i int, s SubnetSpec) {
	pfx, err := netip.ParsePrefix(s.CIDR)
	if err != nil {
		r.fail(path, obj, "cidr %q: %v", s.CIDR, err)
		return
	}
	if pfx.Masked() != pfx {
		r.fail(path, obj, "cidr %s has host bits set; use %s", pfx, pfx.Masked())
		return
	}
	if pfx.Addr().Is4() && pfx.Bits() > 29 || pfx.Addr().Is6() && pfx.Bits() > 120 {
		r.fail(path, obj, "cidr %s is too small for a lab subnet; use at most /29 (IPv4) or /120 (IPv6)", pfx)
		return
	}
	sn := &Subnet{ID: uuid("subnet", n.Name, strconv.Itoa(i)), Net: n, Prefix: pfx, used: map[netip.Addr]string{}, next: 10}
	switch s.Gateway {
	case "":
		sn.Gateway = hostAddr(pfx, 1)
	case "none":
	default:
		gw, err := netip.ParseAddr(s.Gateway)
		if err != nil || !pfx.Contains(gw) {
			r.fail(path, obj, "gateway %q is not an address in %s", s.Gateway, pfx)
			return
		}
		sn.Gateway = gw
	}
	for _, o := range n.Subnets {
		if o.Prefix.Overlaps(pfx) {
			r.fail(path, obj, "subnet %s overlaps %s of the same network", pfx, o.Prefix)
			return
		}
	}
	n.Subnets = append(n.Subnets, sn)
}

// hostAddr is the n-th address of p.
func hostAddr(p netip.Prefix, n uint64) netip.Addr {
	b := p.Addr().As16()
	carry := n
	for i := 15; i >= 0 && carry > 0; i-- {
		v := uint64(b[i]) + carry
		b[i] = byte(v)
		carry = v >> 8
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}

func (r *resolver) networks() {
	for i, ns := range r.t.Networks {
		path := fmt.Sprintf("networks[%d]", i)
		if !nameRE.MatchString(ns.Name) {
			r.fail(path, ns.Name, "network name must match %s", nameRE)
			continue
		}
		if r.c.networks[ns.Name] != nil {
			r.fail(path, ns.Name, "duplicate network name")
			continue
		}
		n := &Network{Name: ns.Name, ID: uuid("network", ns.Name), Shared: ns.Shared, External: ns.External}
		owner := ns.Project
		if owner == "" {
			owner = AdminProject
		}
		n.Project = r.project(path, ns.Name, owner)
		n.Bridge = "brq" + n.ID[:11]
		if len(ns.Subnets) == 0 {
			r.fail(path, ns.Name, "subnets: missing; give at least one cidr")
		}
		for j, s := range ns.Subnets {
			r.newSubnet(fmt.Sprintf("%s.subnets[%d]", path, j), ns.Name, n, j, s)
		}
		if n.External && ns.DHCP {
			r.fail(path, ns.Name, "dhcp on an external network is not modelled; remove dhcp: true")
		}
		r.c.networks[n.Name] = n
		r.c.Networks = append(r.c.Networks, n)
	}
	if len(r.t.LoadBalancers) > 0 {
		cidr := r.t.Octavia.MgmtCIDR
		if cidr == "" {
			cidr = DefaultMgmtCIDR
		}
		name := "lb-mgmt-net"
		if r.c.networks[name] != nil {
			r.fail("networks", name, "the name lb-mgmt-net is reserved for Octavia's management network")
			return
		}
		n := &Network{Name: name, ID: uuid("network", name), Project: r.c.ServiceProject}
		n.Bridge = "brq" + n.ID[:11]
		r.newSubnet("octavia.mgmt_cidr", "", n, 0, SubnetSpec{CIDR: cidr, Gateway: "none"})
		r.c.MgmtNet = n
		r.c.networks[name] = n
		r.c.Networks = append(r.c.Networks, n)
	}
}

// network resolves a network reference.
func (r *resolver) network(path, obj, name string) *Network {
	n := r.c.networks[name]
	if n == nil {
		var names []string
		for _, x := range r.c.Networks {
			names = append(names, x.Name)
		}
		r.fail(path, obj, "network %q is not defined; defined: %s", name, strings.Join(names, ", "))
	}
	return n
}

// newPort registers a port; hostPrefix/devName set later by the caller.
func (r *resolver) newPort(key string, n *Network, owner, deviceID string, proj *Project) *Port {
	p := &Port{ID: uuid("port", key), Net: n, Owner: owner, DeviceID: deviceID, Project: proj, Inventory: true}
	p.MAC = portMAC(p.ID)
	r.c.Ports = append(r.c.Ports, p)
	return p
}

// claim records a fixed address on a port.
func (r *resolver) claim(path, obj string, p *Port, a netip.Addr) bool {
	for _, sn := range p.Net.Subnets {
		if !sn.Prefix.Contains(a) {
			continue
		}
		if a == sn.Prefix.Addr() || (a.Is4() && a == lastAddr(sn.Prefix)) {
			r.fail(path, obj, "%s is the network or broadcast address of %s", a, sn.Prefix)
			return false
		}
		if who, ok := sn.used[a]; ok {
			r.fail(path, obj, "address %s is already used by %s", a, who)
			return false
		}
		sn.used[a] = obj
		p.IPs = append(p.IPs, FixedIP{Subnet: sn, Addr: a})
		return true
	}
	var cidrs []string
	for _, sn := range p.Net.Subnets {
		cidrs = append(cidrs, sn.Prefix.String())
	}
	r.fail(path, obj, "address %s is outside every subnet of network %s (%s)", a, p.Net.Name, strings.Join(cidrs, ", "))
	return false
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	hostBits := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= 1<<hostBits - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

type pendingAlloc struct {
	p      *Port
	sn     *Subnet // nil: one address in every subnet
	v4only bool
	obj    string
}

func (r *resolver) parseAddrs(path, obj string, p *Port, addrs []string) {
	for _, s := range addrs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			r.fail(path, obj, "address %q: %v", s, err)
			continue
		}
		r.claim(path, obj, p, a)
	}
}

func (r *resolver) internet() {
	c := r.c
	var ext []*Network
	for _, n := range c.Networks {
		if n.External {
			ext = append(ext, n)
		}
	}
	if len(ext) == 0 {
		if len(r.t.Internet.Addresses) > 0 {
			r.fail("internet", "", "addresses given but no network is external: true")
		}
		return
	}
	in := &Internet{NS: c.Prefix + "-inet"}
	addrs := r.t.Internet.Addresses
	if len(addrs) == 0 {
		addrs = []string{DefaultInternetAddr}
	}
	for i, s := range addrs {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			r.fail(fmt.Sprintf("internet.addresses[%d]", i), "", "%q is not an IPv4 address", s)
			continue
		}
		for _, n := range c.Networks {
			for _, sn := range n.Subnets {
				if sn.Prefix.Contains(a) {
					r.fail(fmt.Sprintf("internet.addresses[%d]", i), "", "%s is inside subnet %s of network %s; internet addresses must lie outside the cloud", a, sn.Prefix, n.Name)
				}
			}
		}
		in.Addresses = append(in.Addresses, a)
	}
	for k, n := range ext {
		p := r.newPort("upstream/"+n.Name, n, "", "", nil)
		p.Name = "upstream-" + n.Name
		p.Inventory = false // the provider network's physical gateway: not a Neutron port
		p.HostDev, p.NS, p.Dev = "inh"+p.ID[:11], in.NS, "eth"+strconv.Itoa(k)
		for _, sn := range n.Subnets {
			if sn.Prefix.Addr().Is4() && sn.Gateway.IsValid() {
				r.claim("networks", n.Name, p, sn.Gateway)
			}
		}
		if len(p.IPs) == 0 {
			r.fail("networks", n.Name, "external network needs an IPv4 subnet with a gateway (the upstream router)")
		}
		in.Legs = append(in.Legs, p)
	}
	c.Internet = in
}

func (r *resolver) routers() {
	c := r.c
	for i, rs := range r.t.Routers {
		path := fmt.Sprintf("routers[%d]", i)
		if !nameRE.MatchString(rs.Name) {
			r.fail(path, rs.Name, "router name must match %s", nameRE)
			continue
		}
		if c.routers[rs.Name] != nil {
			r.fail(path, rs.Name, "duplicate router name")
			continue
		}
		rt := &Router{Name: rs.Name, ID: uuid("router", rs.Name), NS: c.ns("qr", rs.Name)}
		rt.Project = r.project(path, rs.Name, rs.Project)
		c.routers[rt.Name] = rt
		c.Routers = append(c.Routers, rt)
		if rs.Gateway != "" {
			if g := r.network(path, rs.Name, rs.Gateway); g != nil {
				if !g.External {
					r.fail(path, rs.Name, "gateway %s is not an external network (external: true)", g.Name)
				} else {
					rt.Gateway = g
					p := r.newPort("router-gw/"+rt.Name, g, "network:router_gateway", rt.ID, nil)
					p.Name = ""
					p.HostDev, p.NS, p.Dev = "qgh"+p.ID[:11], rt.NS, "qg-"+p.ID[:11]
					r.pending = append(r.pending, pendingAlloc{p: p, v4only: true, obj: "router " + rt.Name + " gateway"})
					rt.GwPort = p
				}
			}
		}
		seen := map[string]bool{}
		for j, ifs := range rs.Interfaces {
			ipath := fmt.Sprintf("%s.interfaces[%d]", path, j)
			n := r.network(ipath, rs.Name, ifs.Network)
			if n == nil {
				continue
			}
			if n.External {
				r.fail(ipath, rs.Name, "interface on external network %s; use gateway: %s instead", n.Name, n.Name)
				continue
			}
			if seen[n.Name] {
				r.fail(ipath, rs.Name, "second interface on network %s", n.Name)
				continue
			}
			seen[n.Name] = true
			p := r.newPort("router-if/"+rt.Name+"/"+n.Name, n, "network:router_interface", rt.ID, rt.Project)
			p.HostDev, p.NS, p.Dev = "qrh"+p.ID[:11], rt.NS, "qr-"+p.ID[:11]
			if len(ifs.Addresses) > 0 {
				r.parseAddrs(ipath, "router "+rt.Name, p, ifs.Addresses)
			} else {
				for _, sn := range n.Subnets {
					if sn.Gateway.IsValid() {
						r.claim(ipath, "router "+rt.Name, p, sn.Gateway)
					}
				}
				if len(p.IPs) == 0 {
					r.fail(ipath, rs.Name, "network %s has no subnet with a gateway; give addresses:", n.Name)
				}
			}
			for _, o := range rt.Ifaces {
				for _, a := range o.IPs {
					for _, b := range p.IPs {
						if a.Subnet.Prefix.Overlaps(b.Subnet.Prefix) {
							r.fail(ipath, rs.Name, "subnet %s of %s overlaps subnet %s of %s on the same router", b.Subnet.Prefix, n.Name, a.Subnet.Prefix, o.Net.Name)
						}
					}
				}
			}
			rt.Ifaces = append(rt.Ifaces, p)
		}
		for j, ro := range rs.Routes {
			if route, ok := r.route(fmt.Sprintf("%s.routes[%d]", path, j), rs.Name, ro); ok {
				rt.Routes = append(rt.Routes, route)
			}
		}
	}
}

func (r *resolver) dhcp() {
	for _, n := range r.c.Networks {
		var spec *NetworkSpec
		for i := range r.t.Networks {
			if r.t.Networks[i].Name == n.Name {
				spec = &r.t.Networks[i]
			}
		}
		if spec == nil || !spec.DHCP {
			continue
		}
		p := r.newPort("dhcp/"+n.Name, n, "network:dhcp", "dhcp"+hex.EncodeToString(digest("dhcp-host")[:8])+"-"+n.ID, n.Project)
		p.HostDev, p.NS, p.Dev = "nsh"+p.ID[:11], r.c.ns("dhcp", n.Name), "ns-"+p.ID[:11]
		for _, sn := range n.Subnets {
			if sn.Prefix.Addr().Is4() {
				a := hostAddr(sn.Prefix, 2)
				if _, taken := sn.used[a]; !taken && a != sn.Gateway {
					r.claim("networks", n.Name, p, a)
				} else {
					r.pending = append(r.pending, pendingAlloc{p: p, sn: sn, obj: "dhcp port of " + n.Name})
				}
			}
		}
		n.DHCP = p
	}
}

func (r *resolver) hypervisors() {
	seen := map[string]bool{"hv": true}
	for i, h := range r.t.Hypervisors {
		path := fmt.Sprintf("hypervisors[%d]", i)
		switch {
		case !nameRE.MatchString(h) || len(h) > 8:
			r.fail(path, h, "hypervisor name must match %s and have at most 8 characters", nameRE)
		case seen[h]:
			r.fail(path, h, "duplicate hypervisor name (hv is the implicit first one)")
		default:
			seen[h] = true
			r.c.Hypervisors = append(r.c.Hypervisors, r.c.HypervisorNS(h))
		}
	}
}

func (r *resolver) servers() {
	c := r.c
	for i, ss := range r.t.Servers {
		path := fmt.Sprintf("servers[%d]", i)
		if !nameRE.MatchString(ss.Name) {
			r.fail(path, ss.Name, "server name must match %s", nameRE)
			continue
		}
		if c.servers[ss.Name] != nil {
			r.fail(path, ss.Name, "duplicate server name")
			continue
		}
		s := &Server{Name: ss.Name, ID: uuid("server", ss.Name), NS: c.ns("vm", ss.Name)}
		s.Project = r.project(path, ss.Name, ss.Project)
		host := ""
		if ss.Host != "" && ss.Host != "hv" {
			if host = c.HypervisorNS(ss.Host); !slices.Contains(c.Hypervisors, host) {
				r.fail(path, ss.Name, "host %q is not a hypervisor of the topology (hypervisors: %v, and hv)", ss.Host, r.t.Hypervisors)
			}
		}
		c.servers[s.Name] = s
		c.Servers = append(c.Servers, s)
		if len(ss.Ports) == 0 {
			r.fail(path, ss.Name, "ports: missing; a server needs at least one port")
		}
		for j, ps := range ss.Ports {
			ppath := fmt.Sprintf("%s.ports[%d]", path, j)
			n := r.network(ppath, ss.Name, ps.Network)
			if n == nil {
				continue
			}
			p := r.newPort("server/"+s.Name+"/"+strconv.Itoa(j), n, "compute:nova", s.ID, s.Project)
			p.Name = s.Name + "-port" + strconv.Itoa(j)
			p.instance, p.serverIndex = true, j
			p.HostDev, p.NS, p.Dev = "tap"+p.ID[:11], s.NS, "eth"+strconv.Itoa(j)
			p.hostNS = host
			if ps.Inventory != nil && !*ps.Inventory {
				p.Inventory = false
			}
			if ps.MAC != "" {
				m, err := net.ParseMAC(ps.MAC)
				if err != nil || len(m) != 6 || m[0]&1 == 1 {
					r.fail(ppath, ss.Name, "mac %q is not a unicast Ethernet MAC", ps.MAC)
				} else {
					p.MAC = m
				}
			}
			if ps.WireMAC != "" {
				m, err := net.ParseMAC(ps.WireMAC)
				if err != nil || len(m) != 6 || m[0]&1 == 1 {
					r.fail(ppath, ss.Name, "wire_mac %q is not a unicast Ethernet MAC", ps.WireMAC)
				} else {
					p.WireMAC = m
				}
			}
			for k, ap := range ps.AddressPairs {
				apath := fmt.Sprintf("%s.allowed_address_pairs[%d]", ppath, k)
				pair := MACPair{MAC: p.MAC}
				if pf, err := netip.ParsePrefix(ap.IPAddress); err == nil {
					pair.Addr = pf
				} else if a, err := netip.ParseAddr(ap.IPAddress); err == nil {
					pair.Addr = netip.PrefixFrom(a, a.BitLen())
				} else {
					r.fail(apath, ss.Name, "ip_address %q is not an address or CIDR", ap.IPAddress)
				}
				if ap.MACAddress != "" {
					m, err := net.ParseMAC(ap.MACAddress)
					if err != nil || len(m) != 6 || m[0]&1 == 1 {
						r.fail(apath, ss.Name, "mac_address %q is not a unicast Ethernet MAC", ap.MACAddress)
					} else {
						pair.MAC = m
					}
				}
				p.MACPairs = append(p.MACPairs, pair)
			}
			if len(ps.IPs) > 0 {
				r.parseAddrs(ppath, "server "+s.Name, p, ps.IPs)
			} else {
				r.pending = append(r.pending, pendingAlloc{p: p, obj: "server " + s.Name})
			}
			r.subports(ppath, s, p, ps.Subports)
			if ps.FloatingIP.Network != "" {
				r.fipSpecs = append(r.fipSpecs, fipReq{path: ppath, obj: ss.Name, spec: ps.FloatingIP, port: p})
			}
			s.Ports = append(s.Ports, p)
		}
		for j, ro := range ss.Routes {
			rpath := fmt.Sprintf("%s.routes[%d]", path, j)
			route, ok := r.route(rpath, ss.Name, ro)
			if !ok {
				continue
			}
			onLink := false
			for _, p := range s.Ports {
				for _, sn := range p.Net.Subnets {
					onLink = onLink || sn.Prefix.Contains(route.NextHop)
				}
			}
			if !onLink {
				r.fail(rpath, ss.Name, "nexthop %s is on none of the server's networks", route.NextHop)
			}
			s.Routes = append(s.Routes, route)
		}
		for j, la := range ss.Loopback {
			lpath := fmt.Sprintf("%s.loopback[%d]", path, j)
			a, err := netip.ParseAddr(la)
			if err != nil || a.Zone() != "" {
				r.fail(lpath, ss.Name, "loopback %q is not an address", la)
				continue
			}
			for _, n := range c.Networks {
				for _, sn := range n.Subnets {
					if sn.Prefix.Contains(a) {
						r.fail(lpath, ss.Name, "loopback %s is inside subnet %s of network %s; a loopback address stands for a network Neutron does not know", a, sn.Prefix, n.Name)
					}
				}
			}
			s.Loopback = append(s.Loopback, a)
		}
	}
}

// subports resolves a trunk parent's subports: ports of their own (device
// owner trunk:subport, device_id the trunk), by default with the parent's
// MAC, whose addresses the guest holds on the parent's device.
func (r *resolver) subports(path string, s *Server, parent *Port, specs []SubportSpec) {
	if len(specs) == 0 {
		return
	}
	parent.TrunkID = uuid("trunk", parent.ID)
	seen := map[int]bool{}
	for k, sp := range specs {
		spath := fmt.Sprintf("%s.subports[%d]", path, k)
		if sp.VLAN < 1 || sp.VLAN > 4094 || seen[sp.VLAN] {
			r.fail(spath, s.Name, "vlan %d: give a VLAN id 1-4094, once per trunk", sp.VLAN)
			continue
		}
		seen[sp.VLAN] = true
		n := r.network(spath, s.Name, sp.Network)
		if n == nil {
			continue
		}
		if n == parent.Net {
			r.fail(spath, s.Name, "a subport's network must differ from its parent's (%s)", n.Name)
			continue
		}
		q := r.newPort(fmt.Sprintf("%s/vlan%d", parent.ID, sp.VLAN), n, "trunk:subport", parent.TrunkID, s.Project)
		q.Name = fmt.Sprintf("%s-vlan%d", parent.Name, sp.VLAN)
		q.MAC, q.NS, q.Dev, q.Inventory = parent.MAC, parent.NS, parent.Dev, parent.Inventory
		if sp.MAC != "" {
			m, err := net.ParseMAC(sp.MAC)
			if err != nil || len(m) != 6 || m[0]&1 == 1 {
				r.fail(spath, s.Name, "mac %q is not a unicast Ethernet MAC", sp.MAC)
			} else {
				q.MAC = m
			}
		}
		if len(sp.IPs) > 0 {
			r.parseAddrs(spath, "server "+s.Name, q, sp.IPs)
			for _, a := range q.IPs {
				if !a.Addr.Is4() {
					r.fail(spath, s.Name, "subport address %s: the lab tags IPv4 only", a.Addr)
				}
			}
		} else {
			r.pending = append(r.pending, pendingAlloc{p: q, v4only: true, obj: "server " + s.Name + " subport"})
		}
		parent.Subports = append(parent.Subports, Subport{Port: q, VLAN: sp.VLAN})
	}
}

// route parses an extraroute or in-guest route.
func (r *resolver) route(path, obj string, ro RouteSpec) (Route, bool) {
	d, err1 := netip.ParsePrefix(ro.Destination)
	nh, err2 := netip.ParseAddr(ro.NextHop)
	if err1 != nil || err2 != nil {
		r.fail(path, obj, "route needs destination (a CIDR) and nexthop (an address): %q via %q", ro.Destination, ro.NextHop)
		return Route{}, false
	}
	return Route{Dst: d.Masked(), NextHop: nh}, true
}

type fipReq struct {
	path, obj string
	spec      FIPSpec
	port      *Port
	fixed     netip.Addr // LB VIP; else the port's first IPv4
}

func (r *resolver) lbs() {
	c := r.c
	for i, ls := range r.t.LoadBalancers {
		path := fmt.Sprintf("loadbalancers[%d]", i)
		if !nameRE.MatchString(ls.Name) || len(ls.Name) > 20 {
			r.fail(path, ls.Name, "load balancer name must match %s and have at most 20 characters", nameRE)
			continue
		}
		if c.lbs[ls.Name] != nil {
			r.fail(path, ls.Name, "duplicate load balancer name")
			continue
		}
		lb := &LB{Name: ls.Name, ID: uuid("lb", ls.Name), PoolID: uuid("pool", ls.Name), VRID: 10 + i}
		lb.Project = r.project(path, ls.Name, ls.Project)
		c.lbs[lb.Name] = lb
		c.LBs = append(c.LBs, lb)
		switch strings.ToUpper(ls.Topology) {
		case "", "SINGLE":
		case "ACTIVE_STANDBY":
			lb.ActiveStandby = true
		default:
			r.fail(path, ls.Name, "topology %q: use SINGLE or ACTIVE_STANDBY", ls.Topology)
		}
		lb.Protocol = strings.ToUpper(ls.Listener.Protocol)
		if lb.Protocol == "" {
			lb.Protocol = "HTTP"
		}
		if lb.Protocol != "HTTP" && lb.Protocol != "TCP" {
			r.fail(path, ls.Name, "listener protocol %q: use HTTP or TCP", ls.Listener.Protocol)
		}
		lb.ListenPort = ls.Listener.Port
		if lb.ListenPort == 0 {
			lb.ListenPort = 80
		}
		vnet := r.network(path+".vip", ls.Name, ls.VIP.Network)
		if vnet == nil {
			continue
		}
		if vnet.External {
			r.fail(path+".vip", ls.Name, "VIP on external network %s is not modelled; put the VIP on a tenant network and give it a floating_ip", vnet.Name)
			continue
		}
		vip := r.newPort("vip/"+lb.Name, vnet, "Octavia", "lb-"+lb.ID, lb.Project)
		vip.Name = "octavia-lb-" + lb.ID
		lb.VIPPort = vip
		if ls.VIP.Address != "" {
			r.parseAddrs(path+".vip", "load balancer "+lb.Name+" VIP", vip, []string{ls.VIP.Address})
		} else {
			r.pending = append(r.pending, pendingAlloc{p: vip, v4only: true, obj: "load balancer " + lb.Name + " VIP"})
		}
		n := 1
		if lb.ActiveStandby {
			n = 2
		}
		// Member networks other than the VIP network get an extra
		// amphora port each (Octavia plugs the amphora there).
		var memberNets []*Network
		for j, ms := range ls.Members {
			mpath := fmt.Sprintf("%s.members[%d]", path, j)
			s := c.servers[ms.Server]
			if s == nil {
				r.fail(mpath, ls.Name, "member server %q is not defined", ms.Server)
				continue
			}
			var port *Port
			for _, p := range s.Ports {
				if ms.Network == "" || p.Net.Name == ms.Network {
					port = p
					break
				}
			}
			if port == nil {
				if ms.Network == "" {
					r.fail(mpath, ls.Name, "server %s has no usable port", s.Name)
				} else {
					r.fail(mpath, ls.Name, "server %s has no port on network %s", s.Name, ms.Network)
				}
				continue
			}
			m := &Member{ID: uuid("member", lb.Name, strconv.Itoa(j)), Server: s, Port: port, ProtocolPort: ms.Port}
			if m.ProtocolPort == 0 {
				m.ProtocolPort = HTTPPort
			}
			lb.Members = append(lb.Members, m)
			if port.Net != vnet && !slices.Contains(memberNets, port.Net) {
				memberNets = append(memberNets, port.Net)
			}
		}
		for k := 1; k <= n; k++ {
			a := &Amphora{ID: uuid("amphora", lb.Name, strconv.Itoa(k)), ComputeID: uuid("amphora-vm", lb.Name, strconv.Itoa(k)),
				Name: fmt.Sprintf("%s-amphora-%d", lb.Name, k), LB: lb, NS: c.ns("amp", fmt.Sprintf("%s-%d", lb.Name, k)), Role: "STANDALONE"}
			if lb.ActiveStandby {
				a.Role = map[int]string{1: "MASTER", 2: "BACKUP"}[k]
			}
			nets := append([]*Network{c.MgmtNet, vnet}, memberNets...)
			for e, net := range nets {
				proj := c.ServiceProject
				p := r.newPort(fmt.Sprintf("amphora/%s/%d/%s", lb.Name, k, net.Name), net, "compute:nova", a.ComputeID, proj)
				p.instance = true
				p.HostDev, p.NS, p.Dev = "tap"+p.ID[:11], a.NS, "eth"+strconv.Itoa(e)
				switch e {
				case 0:
					p.Name = "amphora-mgmt"
					a.Mgmt = p
				case 1:
					p.Name = "octavia-lb-vrrp-" + a.ID
					a.VRRP = p
				}
				r.pending = append(r.pending, pendingAlloc{p: p, v4only: true, obj: "amphora " + a.Name})
				a.Ports = append(a.Ports, p)
			}
			lb.Amphorae = append(lb.Amphorae, a)
		}
		if ls.FloatingIP.Network != "" {
			r.fipSpecs = append(r.fipSpecs, fipReq{path: path, obj: ls.Name, spec: ls.FloatingIP, port: vip})
		}
	}
}

func (r *resolver) fips() {
	c := r.c
	for _, req := range r.fipSpecs {
		n := r.network(req.path+".floating_ip", req.obj, req.spec.Network)
		if n == nil {
			continue
		}
		if !n.External {
			r.fail(req.path+".floating_ip", req.obj, "floating IP network %s is not external", n.Name)
			continue
		}
		var rt *Router
		for _, x := range c.Routers {
			if x.Gateway != n {
				continue
			}
			for _, ifc := range x.Ifaces {
				if ifc.Net == req.port.Net {
					rt = x
				}
			}
			if rt != nil {
				break
			}
		}
		if rt == nil {
			r.fail(req.path+".floating_ip", req.obj, "no router has gateway %s and an interface on %s; add one (Neutron refuses such a floating IP too)", n.Name, req.port.Net.Name)
			continue
		}
		f := &FIP{ID: uuid("fip", req.port.ID, n.Name), Net: n, Port: req.port, Router: rt}
		f.Holder = r.newPort("fip/"+f.ID, n, "network:floatingip", f.ID, req.port.Project)
		if req.spec.Address != "" {
			r.parseAddrs(req.path+".floating_ip", req.obj+" floating IP", f.Holder, []string{req.spec.Address})
		} else {
			r.pending = append(r.pending, pendingAlloc{p: f.Holder, v4only: true, obj: req.obj + " floating IP"})
		}
		if req.port.FIP != nil {
			r.fail(req.path+".floating_ip", req.obj, "a port has one floating IP at most")
			continue
		}
		req.port.FIP = f
		rt.FIPs = append(rt.FIPs, f)
		c.FIPs = append(c.FIPs, f)
	}
}

// allocate gives addresses to everything that asked for one, in
// declaration order, from host .10 (IPv4) or ::10 (IPv6) upwards.
func (r *resolver) allocate() {
	for _, pa := range r.pending {
		subnets := pa.p.Net.Subnets
		if pa.sn != nil {
			subnets = []*Subnet{pa.sn}
		}
		got := false
		for _, sn := range subnets {
			if pa.v4only && !sn.Prefix.Addr().Is4() {
				continue
			}
			if pa.v4only && got {
				break
			}
			a, ok := sn.alloc(pa.obj)
			if !ok {
				r.fail("networks", pa.p.Net.Name, "subnet %s is full (allocating for %s)", sn.Prefix, pa.obj)
				continue
			}
			pa.p.IPs = append(pa.p.IPs, FixedIP{Subnet: sn, Addr: a})
			got = true
		}
		if !got {
			r.fail("networks", pa.p.Net.Name, "no IPv4 subnet to allocate from for %s", pa.obj)
		}
	}
	// Floating IPs and VIPs are known now.
	for _, f := range r.c.FIPs {
		f.Addr = f.Holder.V4()
		f.Fixed = f.Port.V4()
		if !f.Fixed.IsValid() {
			r.fail("floatingips", f.Port.Name, "the port of a floating IP needs an IPv4 address")
		}
	}
	for _, lb := range r.c.LBs {
		lb.VIP = lb.VIPPort.V4()
		if len(lb.VIPPort.IPs) > 0 {
			lb.VIPSubnet = lb.VIPPort.IPs[0].Subnet
		}
		for _, a := range lb.Amphorae {
			a.VRRP.AddrPairs = []netip.Addr{lb.VIP}
		}
		for _, m := range lb.Members {
			m.Addr = m.Port.V4()
			for _, ip := range m.Port.IPs {
				if ip.Addr == m.Addr {
					m.Subnet = ip.Subnet
				}
			}
		}
	}
}

func (sn *Subnet) alloc(obj string) (netip.Addr, bool) {
	size := uint64(1) << min(uint(sn.Prefix.Addr().BitLen()-sn.Prefix.Bits()), 20)
	for ; sn.next < size-1; sn.next++ {
		a := hostAddr(sn.Prefix, sn.next)
		if _, taken := sn.used[a]; taken || a == sn.Gateway {
			continue
		}
		sn.used[a] = obj
		sn.next++
		return a, true
	}
	return netip.Addr{}, false
}

// checkUnique guards what the kernel needs unique: MACs on a bridge, tap
// names, and the names of namespaces.
func (r *resolver) checkUnique() {
	macs := map[string]*Port{}
	devs := map[string]bool{}
	for _, p := range r.c.Ports {
		if p.HostDev == "" {
			continue
		}
		// Neutron keeps MACs unique per network; another network may reuse
		// one (scenario mac-reuse: another project's port with a MAC
		// another port released).
		key := p.Net.ID + "/" + p.MAC.String()
		if o := macs[key]; o != nil {
			r.fail("servers", p.Name, "MAC %s is used by two ports of network %s (%s and %s)", p.MAC, p.Net.Name, o.ID, p.ID)
		}
		macs[key] = p
		if devs[p.HostDev] {
			r.fail("servers", p.Name, "device name %s is not unique; rename an object", p.HostDev)
		}
		devs[p.HostDev] = true
	}
	seen := map[string]bool{}
	for _, ns := range r.c.Namespaces() {
		if seen[ns] {
			r.fail("servers", ns, "namespace name %s is used twice; rename an object", ns)
		}
		seen[ns] = true
	}
}
