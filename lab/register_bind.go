package lab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Bind rewrites the cloud with what OpenStack made (reg): ids, MACs,
// addresses and the names derived from them (tap<id[:11]>, brq…, qr-…),
// so the namespaces carry exactly the objects the APIs list.
func (c *Cloud) Bind(reg *Registration) error {
	if reg == nil {
		return nil
	}
	id := func(s *string) {
		if v, ok := reg.IDs[*s]; ok {
			*s = v
		}
	}
	for _, p := range c.Projects {
		id(&p.ID)
	}
	for _, n := range c.Networks {
		old := n.ID
		id(&n.ID)
		if n.ID != old {
			n.Bridge = "brq" + n.ID[:11]
		}
		for _, sn := range n.Subnets {
			id(&sn.ID)
		}
	}
	for _, rt := range c.Routers {
		id(&rt.ID)
	}
	for _, s := range c.Servers {
		id(&s.ID)
		for _, p := range s.Ports {
			p.DeviceID = s.ID
		}
	}
	for _, p := range c.Ports {
		old := p.ID
		if b, ok := reg.Ports[p.ID]; ok {
			if err := c.bindPort(p, b); err != nil {
				return err
			}
		} else {
			id(&p.ID)
		}
		if p.ID != old && len(old) >= 11 && len(p.ID) >= 11 {
			p.HostDev = strings.Replace(p.HostDev, old[:11], p.ID[:11], 1)
			p.Dev = strings.Replace(p.Dev, old[:11], p.ID[:11], 1)
		}
	}
	for _, f := range c.FIPs {
		id(&f.ID)
		f.Holder.DeviceID = f.ID
		f.Addr, f.Fixed = f.Holder.V4(), f.Port.V4()
	}
	for _, rt := range c.Routers {
		for _, p := range rt.Ifaces {
			p.DeviceID = rt.ID
		}
		if rt.GwPort != nil {
			rt.GwPort.DeviceID = rt.ID
		}
	}
	for _, lb := range c.LBs {
		id(&lb.ID)
		id(&lb.PoolID)
		lb.VIPPort.DeviceID = "lb-" + lb.ID
		lb.VIPPort.Name = "octavia-lb-" + lb.ID
		lb.VIP = lb.VIPPort.V4()
		for _, m := range lb.Members {
			id(&m.ID)
			m.Addr = m.Port.V4()
		}
		for _, a := range lb.Amphorae {
			if b, ok := reg.Amphorae[a.ID]; ok {
				a.ID, a.ComputeID, a.Role = b.ID, b.ComputeID, b.Role
			}
			for _, p := range a.Ports {
				p.DeviceID = a.ComputeID
			}
			a.VRRP.Name = "octavia-lb-vrrp-" + a.ID
			a.VRRP.AddrPairs = []netip.Addr{lb.VIP}
		}
	}
	return nil
}

func (c *Cloud) bindPort(p *Port, b BoundPort) error {
	mac, err := net.ParseMAC(b.MAC)
	if err != nil {
		return fmt.Errorf("lab: registered port %s: MAC %q: %w", b.ID, b.MAC, err)
	}
	var ips []FixedIP
	for _, s := range b.IPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("lab: registered port %s: address %q: %w", b.ID, s, err)
		}
		var sn *Subnet
		for _, x := range p.Net.Subnets {
			if x.Prefix.Contains(a) {
				sn = x
			}
		}
		if sn == nil {
			return fmt.Errorf("lab: registered port %s: address %s is in no subnet of network %s", b.ID, a, p.Net.Name)
		}
		ips = append(ips, FixedIP{Subnet: sn, Addr: a})
	}
	p.ID, p.MAC, p.IPs = b.ID, mac, ips
	return nil
}
