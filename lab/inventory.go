package lab

import (
	"fmt"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/inventory"
)

// Inventory is the static inventory (docs/inventory.md) describing the
// cloud as Neutron, Nova and Octavia would. present overrides, per server
// name, whether its ports and the server are listed (nil: as the topology
// says — ports with `inventory: false` are left out).
func (c *Cloud) Inventory(present map[string]bool) *inventory.Inventory {
	inv := &inventory.Inventory{}
	for _, p := range c.Projects {
		inv.Projects = append(inv.Projects, inventory.Project{ID: p.ID, Name: p.Name})
	}
	for _, n := range c.Networks {
		inv.Networks = append(inv.Networks, inventory.Network{ID: n.ID, Name: n.Name, ProjectID: n.Project.ID, Shared: n.Shared, External: n.External})
		for _, sn := range n.Subnets {
			s := inventory.Subnet{ID: sn.ID, NetworkID: n.ID, ProjectID: n.Project.ID, CIDR: sn.Prefix.String(), IPVersion: 4}
			if sn.Prefix.Addr().Is6() {
				s.IPVersion = 6
			}
			if sn.Gateway.IsValid() {
				s.GatewayIP = sn.Gateway.String()
			}
			inv.Subnets = append(inv.Subnets, s)
		}
	}
	listed := func(p *Port) bool {
		if !p.Inventory && p.Owner == "" {
			return false // upstream router: not a Neutron port
		}
		if p.instance && p.DeviceID != "" {
			for _, s := range c.Servers {
				if s.ID == p.DeviceID {
					if v, ok := present[s.Name]; ok {
						return v
					}
				}
			}
		}
		return p.Inventory
	}
	for _, p := range c.Ports {
		if !listed(p) {
			continue
		}
		ip := inventory.Port{ID: p.ID, Name: p.Name, NetworkID: p.Net.ID, MACAddress: p.MAC.String(),
			DeviceOwner: p.Owner, DeviceID: p.DeviceID}
		if p.Project != nil {
			ip.ProjectID = p.Project.ID
		}
		for _, a := range p.IPs {
			ip.FixedIPs = append(ip.FixedIPs, inventory.FixedIP{SubnetID: a.Subnet.ID, IPAddress: a.Addr.String()})
		}
		for _, a := range p.AddrPairs {
			ip.AllowedAddressPairs = append(ip.AllowedAddressPairs, inventory.AddressPair{IPAddress: a.String(), MACAddress: p.MAC.String()})
		}
		for _, a := range p.MACPairs {
			ap := a.Addr.String()
			if a.Addr.IsSingleIP() {
				ap = a.Addr.Addr().String()
			}
			ip.AllowedAddressPairs = append(ip.AllowedAddressPairs, inventory.AddressPair{IPAddress: ap, MACAddress: a.MAC.String()})
		}
		inv.Ports = append(inv.Ports, ip)
		if len(p.Subports) > 0 {
			tr := inventory.Trunk{ID: p.TrunkID, Name: p.Name + "-trunk", PortID: p.ID}
			if p.Project != nil {
				tr.ProjectID = p.Project.ID
			}
			for _, sp := range p.Subports {
				tr.SubPorts = append(tr.SubPorts, inventory.SubPort{SegmentationType: "vlan", SegmentationID: sp.VLAN, PortID: sp.Port.ID})
			}
			inv.Trunks = append(inv.Trunks, tr)
		}
	}
	for _, r := range c.Routers {
		ir := inventory.Router{ID: r.ID, Name: r.Name, ProjectID: r.Project.ID, Routes: []inventory.Route{}}
		if r.Gateway != nil {
			gi := &inventory.GatewayInfo{NetworkID: r.Gateway.ID}
			for _, a := range r.GwPort.IPs {
				gi.ExternalFixedIPs = append(gi.ExternalFixedIPs, inventory.ExternalFixedIP{SubnetID: a.Subnet.ID, IPAddress: a.Addr.String()})
			}
			ir.ExternalGatewayInfo = gi
		}
		for _, rt := range r.Routes {
			ir.Routes = append(ir.Routes, inventory.Route{Destination: rt.Dst.String(), NextHop: rt.NextHop.String()})
		}
		inv.Routers = append(inv.Routers, ir)
	}
	for _, f := range c.FIPs {
		if !listed(f.Port) && f.Port.instance {
			continue
		}
		inv.FloatingIPs = append(inv.FloatingIPs, inventory.FloatingIP{ID: f.ID, FloatingIPAddress: f.Addr.String(),
			FloatingNetworkID: f.Net.ID, PortID: f.Port.ID, FixedIPAddress: f.Fixed.String(), RouterID: f.Router.ID,
			ProjectID: f.Port.Project.ID})
	}
	for _, s := range c.Servers {
		keep := false
		for _, p := range s.Ports {
			keep = keep || listed(p)
		}
		if keep {
			inv.Servers = append(inv.Servers, inventory.Server{ID: s.ID, Name: s.Name, TenantID: s.Project.ID})
		}
	}
	for _, lb := range c.LBs {
		inv.LoadBalancers = append(inv.LoadBalancers, inventory.LoadBalancer{ID: lb.ID, Name: lb.Name, ProjectID: lb.Project.ID,
			VIPAddress: lb.VIP.String(), VIPPortID: lb.VIPPort.ID, VIPSubnetID: lb.VIPSubnet.ID, VIPNetworkID: lb.VIPPort.Net.ID,
			Provider: "amphora", ProvisioningStatus: "ACTIVE"})
		for _, a := range lb.Amphorae {
			inv.Servers = append(inv.Servers, inventory.Server{ID: a.ComputeID, Name: a.Name, TenantID: c.ServiceProject.ID})
			inv.Amphorae = append(inv.Amphorae, inventory.Amphora{ID: a.ID, LoadBalancerID: lb.ID, ComputeID: a.ComputeID,
				LBNetworkIP: a.Mgmt.V4().String(), VRRPIP: a.VRRP.V4().String(), HAIP: lb.VIP.String(),
				VRRPPortID: a.VRRP.ID, HAPortID: lb.VIPPort.ID, Role: a.Role, Status: "ALLOCATED"})
		}
		pool := inventory.Pool{ID: lb.PoolID, Name: lb.Name + "-pool", ProjectID: lb.Project.ID,
			LoadBalancers: []inventory.LoadBalancerRef{{ID: lb.ID}}}
		for _, m := range lb.Members {
			pool.Members = append(pool.Members, inventory.Member{ID: m.ID, Name: m.Server.Name, Address: m.Addr.String(),
				ProtocolPort: m.ProtocolPort, SubnetID: m.Subnet.ID, ProjectID: lb.Project.ID})
		}
		inv.Pools = append(inv.Pools, pool)
	}
	return inv
}

// WriteInventory writes the inventory file atomically (temporary file,
// fsync, rename), as the file provider expects.
func (c *Cloud) WriteInventory(path string, present map[string]bool) error {
	inv := c.Inventory(present)
	body, err := yaml.Marshal(inv)
	if err != nil {
		return fmt.Errorf("lab: encode inventory: %w", err)
	}
	head := fmt.Sprintf("# Written by `tapflow lab` for lab %q; the format is docs/inventory.md.\n", c.Prefix)
	return writeAtomic(path, append([]byte(head), body...))
}

func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("lab: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("lab: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("lab: install %s: %w", path, err)
	}
	return nil
}
