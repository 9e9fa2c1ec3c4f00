package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Up builds the cloud: namespaces, bridges, veths, addresses, routes,
// nftables, the lab servers, HAProxy and keepalived, then writes the
// inventory file. It returns once every server listens and every load
// balancer's VIP is up. On any error it removes everything it made.
func (l *Lab) Up(ctx context.Context) (err error) {
	if err := l.Preflight(); err != nil {
		return err
	}
	start := time.Now()
	defer func() {
		if err != nil {
			l.log.Error("lab up failed; removing what was made", "err", err)
			if derr := l.Down(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	for _, d := range []string{l.dir, filepath.Join(l.dir, "logs"), filepath.Join(l.dir, "ready")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("lab: state directory: %w", err)
		}
	}
	if err := l.saveState(); err != nil {
		return err
	}
	if l.opts.Register != nil {
		if err := l.register(ctx); err != nil {
			return err
		}
	}
	c := l.Cloud
	steps := []struct {
		what string
		f    func(context.Context) error
	}{
		{"hypervisor", l.upHypervisor},
		{"internet", l.upInternet},
		{"routers", l.upRouters},
		{"dhcp", l.upDHCP},
		{"servers", l.upServers},
		{"amphorae", l.upAmphorae},
		{"inventory", func(context.Context) error { return c.WriteInventory(l.InventoryPath(), maps(l.present)) }},
		{"readiness", l.waitReady},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("lab up (%s): %w", s.what, err)
		}
		l.log.Debug("lab up step", "step", s.what, "took", time.Since(t).Round(time.Millisecond))
	}
	inv := l.InventoryPath()
	if l.reg != nil {
		inv = "openstack " + l.reg.AuthURL + " (" + l.CloudsPath() + ")"
	}
	l.log.Info("lab up", "prefix", c.Prefix, "namespaces", len(c.Namespaces()), "taps", len(c.Taps()),
		"commands", l.ncmd.Load(), "took", time.Since(start).Round(time.Millisecond), "inventory", inv)
	return nil
}

// nsBase creates a namespace with lo up and the given sysctls.
func (l *Lab) nsBase(ctx context.Context, ns string, sysctls ...string) error {
	if err := l.ip(ctx, "", "netns", "add", ns); err != nil {
		return err
	}
	if err := l.ip(ctx, ns, "link", "set", "lo", "up"); err != nil {
		return err
	}
	if len(sysctls) > 0 {
		return l.sysctl(ctx, ns, sysctls...)
	}
	return nil
}

var (
	noIPv6 = []string{"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"}
	// quietIPv6: addresses usable at once, no router solicitations.
	quietIPv6 = []string{"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
		"net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0",
		"net.ipv6.conf.all.router_solicitations=0", "net.ipv6.conf.default.router_solicitations=0"}
	noRPFilter = []string{"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"}
)

func (l *Lab) upHypervisor(ctx context.Context) error {
	for k, hv := range append([]string{l.Cloud.HVNS()}, l.Cloud.Hypervisors...) {
		if err := l.nsBase(ctx, hv, noIPv6...); err != nil {
			return err
		}
		for _, n := range l.Cloud.Networks {
			// STP off (ports forward at once), no multicast snooping (groups
			// flood, like Neutron's bridges), no addresses.
			if err := l.ip(ctx, hv, "link", "add", n.Bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0"); err != nil {
				return err
			}
			if err := l.ip(ctx, hv, "link", "set", n.Bridge, "up"); err != nil {
				return err
			}
			if k == 0 {
				continue
			}
			// Another compute node: its bridge joins the first one's over a
			// veth standing for the overlay tunnel (not tap*: not captured).
			dev := fmt.Sprintf("vx%d%s", k, n.ID[:10])
			if err := l.ip(ctx, l.Cloud.HVNS(), "link", "add", dev, "type", "veth", "peer", "name", dev, "netns", hv); err != nil {
				return err
			}
			for _, ns := range []string{l.Cloud.HVNS(), hv} {
				if err := l.ip(ctx, ns, "link", "set", dev, "master", n.Bridge, "up"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// plug creates the veth of port p: host side p.HostDev on its network's
// bridge in the hypervisor, the other side p.Dev in p.NS with the port's
// MAC and addresses.
func (l *Lab) plug(ctx context.Context, p *Port, v6 bool) error {
	hv := p.HostNS(l.Cloud)
	if err := l.ip(ctx, hv, "link", "add", p.HostDev, "type", "veth", "peer", "name", p.Dev, "netns", p.NS); err != nil {
		return err
	}
	if p.instance {
		// libvirt gives the host side of a tap the port MAC with fe: first.
		hm := net.HardwareAddr{0xfe, p.MAC[1], p.MAC[2], p.MAC[3], p.MAC[4], p.MAC[5]}
		if err := l.ip(ctx, hv, "link", "set", p.HostDev, "address", hm.String()); err != nil {
			return err
		}
	}
	if err := l.ip(ctx, hv, "link", "set", p.HostDev, "master", p.Net.Bridge, "up"); err != nil {
		return err
	}
	if err := l.ip(ctx, p.NS, "link", "set", p.Dev, "address", p.GuestMAC().String()); err != nil {
		return err
	}
	for _, a := range p.IPs {
		if a.Addr.Is6() && !v6 {
			continue
		}
		args := []string{"addr", "add", netip.PrefixFrom(a.Addr, a.Subnet.Prefix.Bits()).String(), "dev", p.Dev}
		if a.Addr.Is6() {
			args = append(args, "nodad")
		}
		if err := l.ip(ctx, p.NS, args...); err != nil {
			return err
		}
	}
	return l.ip(ctx, p.NS, "link", "set", p.Dev, "up")
}

func (l *Lab) serve(ns, name string, args ...string) error {
	ready := filepath.Join(l.dir, "ready", name)
	os.Remove(ready)
	argv := l.opts.Helper.argv(append([]string{"serve", "--ready", ready}, args...)...)
	_, err := l.spawn(ns, name, l.opts.Helper.Env, argv...)
	return err
}

func (l *Lab) upInternet(ctx context.Context) error {
	in := l.Cloud.Internet
	if in == nil {
		return nil
	}
	if err := l.nsBase(ctx, in.NS, noIPv6...); err != nil {
		return err
	}
	for _, p := range in.Legs {
		if err := l.plug(ctx, p, false); err != nil {
			return err
		}
	}
	for _, a := range in.Addresses {
		if err := l.ip(ctx, in.NS, "addr", "add", a.String()+"/32", "dev", "lo"); err != nil {
			return err
		}
	}
	// Clients in the internet send from an internet address, never from
	// the upstream router's own address on the external subnet (that one
	// is the subnet's gateway_ip: attribution rightly calls it infra).
	// Leg k sends from internet address k (the last one when there are
	// fewer), so a second external network can have its own clients.
	for k, p := range in.Legs {
		src := in.Addresses[min(k, len(in.Addresses)-1)]
		for _, a := range p.IPs {
			if err := l.ip(ctx, in.NS, "route", "replace", a.Subnet.Prefix.String(), "dev", p.Dev, "proto", "kernel",
				"scope", "link", "src", src.String()); err != nil {
				return err
			}
		}
	}
	port := strconv.Itoa(TCPPort)
	return l.serve(in.NS, "internet", "--tcp", "0.0.0.0:"+port, "--udp", "0.0.0.0:"+port, "--http", "0.0.0.0:"+strconv.Itoa(HTTPPort))
}

func (l *Lab) upRouters(ctx context.Context) error {
	for _, r := range l.Cloud.Routers {
		sysctls := append([]string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.forwarding=1"}, quietIPv6...)
		sysctls = append(sysctls, noRPFilter...)
		if err := l.nsBase(ctx, r.NS, sysctls...); err != nil {
			return err
		}
		for _, p := range r.Ifaces {
			if err := l.plug(ctx, p, true); err != nil {
				return err
			}
		}
		if r.GwPort != nil {
			if err := l.plug(ctx, r.GwPort, false); err != nil {
				return err
			}
			// The L3 agent puts each floating IP on qg- as a /32 so the
			// router answers ARP for it.
			for _, f := range r.FIPs {
				if err := l.ip(ctx, r.NS, "addr", "add", f.Addr.String()+"/32", "dev", r.GwPort.Dev); err != nil {
					return err
				}
			}
			for _, sn := range r.Gateway.Subnets {
				if sn.Prefix.Addr().Is4() && sn.Gateway.IsValid() {
					if err := l.ip(ctx, r.NS, "route", "add", "default", "via", sn.Gateway.String(), "dev", r.GwPort.Dev); err != nil {
						return err
					}
					break
				}
			}
		}
		for _, rt := range r.Routes {
			if err := l.ip(ctx, r.NS, "route", "add", rt.Dst.String(), "via", rt.NextHop.String()); err != nil {
				return err
			}
		}
		rules := l.routerNFT(r)
		path := filepath.Join(l.dir, "nft-"+r.Name+".conf")
		if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		if _, err := l.nsexec(ctx, r.NS, "nft", "-f", path); err != nil {
			return err
		}
		if err := l.serve(r.NS, "metadata-"+r.Name, "--http", "0.0.0.0:"+strconv.Itoa(MetadataPort)); err != nil {
			return err
		}
	}
	return nil
}

// routerNFT is the router's NAT: the metadata redirect (Neutron's
// 169.254.169.254:80 → the proxy on 9697), DNAT of floating IPs, SNAT of
// floating-IP ports and of the router's subnets on the gateway, and the
// same SNAT for hairpinned (DNATed) traffic so replies come back through
// the router.
func (l *Lab) routerNFT(r *Router) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# tapflow lab: NAT of router %s (%s)\ntable ip tapflow_lab {\n", r.Name, r.ID)
	b.WriteString("\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n")
	fmt.Fprintf(&b, "\t\tip daddr %s tcp dport 80 redirect to :%d\n", MetadataAddr, MetadataPort)
	for _, f := range r.FIPs {
		fmt.Fprintf(&b, "\t\tip daddr %s dnat to %s\n", f.Addr, f.Fixed)
	}
	b.WriteString("\t}\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
	if r.GwPort != nil {
		gw := r.GwPort.V4()
		for _, f := range r.FIPs {
			fmt.Fprintf(&b, "\t\tip saddr %s oifname \"qg-*\" snat to %s\n", f.Fixed, f.Addr)
			fmt.Fprintf(&b, "\t\tip saddr %s ct status dnat snat to %s\n", f.Fixed, f.Addr)
		}
		for _, p := range r.Ifaces {
			for _, a := range p.IPs {
				if a.Addr.Is4() {
					fmt.Fprintf(&b, "\t\tip saddr %s oifname \"qg-*\" snat to %s\n", a.Subnet.Prefix, gw)
					fmt.Fprintf(&b, "\t\tip saddr %s ct status dnat snat to %s\n", a.Subnet.Prefix, gw)
				}
			}
		}
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

func (l *Lab) upDHCP(ctx context.Context) error {
	for _, n := range l.Cloud.Networks {
		p := n.DHCP
		if p == nil {
			continue
		}
		if err := l.nsBase(ctx, p.NS, noIPv6...); err != nil {
			return err
		}
		if err := l.plug(ctx, p, false); err != nil {
			return err
		}
		if err := l.serve(p.NS, "dhcp-"+n.Name, "--udp", "0.0.0.0:"+strconv.Itoa(DHCPPort), "--udp", "0.0.0.0:53"); err != nil {
			return err
		}
	}
	return nil
}

func (l *Lab) upServers(ctx context.Context) error {
	for _, s := range l.Cloud.Servers {
		if err := l.nsBase(ctx, s.NS, quietIPv6...); err != nil {
			return err
		}
		if err := l.wireServer(ctx, s); err != nil {
			return err
		}
		for _, a := range s.Loopback {
			if err := l.ip(ctx, s.NS, "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo"); err != nil {
				return err
			}
		}
		port := strconv.Itoa(TCPPort)
		args := []string{"--tcp", "[::]:" + port, "--udp", "[::]:" + port, "--http", "[::]:" + strconv.Itoa(HTTPPort)}
		for _, p := range s.Ports {
			for _, sp := range p.Subports {
				// The lab server of a trunk's guest holds its VLAN tagging.
				args = append(args, "--vlan", VLANTag{Dev: p.Dev, VID: sp.VLAN, Subnet: sp.Port.IPs[0].Subnet.Prefix}.String())
			}
		}
		if err := l.serve(s.NS, "vm-"+s.Name, args...); err != nil {
			return err
		}
	}
	return nil
}

// wireServer plugs a server's ports (veths, MACs, addresses) and adds its
// default and in-guest routes: at Up, and again when a scenario plugs it
// back (events.go).
func (l *Lab) wireServer(ctx context.Context, s *Server) error {
	var gw4, gw6 netip.Addr
	var dev4, dev6 string
	for _, p := range s.Ports {
		if err := l.plug(ctx, p, true); err != nil {
			return err
		}
		for _, sp := range p.Subports {
			// A subport's addresses sit on the parent's device; its
			// frames are tagged by the guest's lab server (vlan.go).
			for _, a := range sp.Port.IPs {
				if err := l.ip(ctx, p.NS, "addr", "add", netip.PrefixFrom(a.Addr, a.Subnet.Prefix.Bits()).String(), "dev", p.Dev); err != nil {
					return err
				}
			}
		}
		for _, a := range p.IPs {
			g := a.Subnet.Gateway
			if !g.IsValid() {
				continue
			}
			if g.Is4() && !gw4.IsValid() {
				gw4, dev4 = g, p.Dev
			}
			if g.Is6() && !gw6.IsValid() {
				gw6, dev6 = g, p.Dev
			}
		}
	}
	if gw4.IsValid() {
		if err := l.ip(ctx, s.NS, "route", "add", "default", "via", gw4.String(), "dev", dev4); err != nil {
			return err
		}
	}
	if gw6.IsValid() {
		if err := l.ip(ctx, s.NS, "-6", "route", "add", "default", "via", gw6.String(), "dev", dev6); err != nil {
			return err
		}
	}
	for _, rt := range s.Routes {
		if err := l.ip(ctx, s.NS, "route", "add", rt.Dst.String(), "via", rt.NextHop.String()); err != nil {
			return err
		}
	}
	return nil
}

// readyTimeout bounds the wait for the lab servers. They are ordinary
// processes that start in well under a second, but on a loaded 2-core CI
// box (test packages in parallel) 20 s was once not enough for two of them.
const readyTimeout = 2 * time.Minute

// waitReady waits for every lab server's ready file and every VIP.
func (l *Lab) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(readyTimeout)
	ents := func() map[string]bool {
		m := map[string]bool{}
		es, _ := os.ReadDir(filepath.Join(l.dir, "ready"))
		for _, e := range es {
			m[e.Name()] = true
		}
		return m
	}
	var want []string
	if l.Cloud.Internet != nil {
		want = append(want, "internet")
	}
	for _, r := range l.Cloud.Routers {
		want = append(want, "metadata-"+r.Name)
	}
	for _, n := range l.Cloud.Networks {
		if n.DHCP != nil {
			want = append(want, "dhcp-"+n.Name)
		}
	}
	for _, s := range l.Cloud.Servers {
		want = append(want, "vm-"+s.Name)
	}
	for {
		have := ents()
		var missing []string
		for _, w := range want {
			if !have[w] {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			break
		}
		for _, m := range missing {
			if l.exited(m) {
				return fmt.Errorf("lab server %s exited before it was ready; its log:\n%s", m, l.logTail(m))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab servers not ready after %s: %s (logs in %s)", readyTimeout, strings.Join(missing, ", "), filepath.Join(l.dir, "logs"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	for _, lb := range l.Cloud.LBs {
		if _, err := l.WaitVIP(ctx, lb, nil, 20*time.Second); err != nil {
			return err
		}
		if err := l.waitListening(ctx, lb, 10*time.Second); err != nil {
			return err
		}
	}
	return nil
}
