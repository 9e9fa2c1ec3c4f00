package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Events a scenario injects while traffic runs: what Nova does to a
// server's taps (unplug: delete the VM, or migrate it away; plug: boot it,
// or land it). The inventory is separate (add / remove steps), as Nova and
// Neutron are.

// attachTimeout bounds the wait for tapflow to attach a new tap (netlink
// event or the 1 s rescan; generous for a loaded CI box).
const attachTimeout = 30 * time.Second

// Unplug deletes the server's taps in the hypervisor namespace (the veth
// pairs, so the guest's devices go too); its namespace and processes stay.
func (l *Lab) Unplug(ctx context.Context, server string) error {
	s := l.Cloud.Server(server)
	if s == nil {
		return fmt.Errorf("lab: server %q is not in the topology", server)
	}
	for _, p := range s.Ports {
		if err := l.ip(ctx, p.HostNS(l.Cloud), "link", "del", p.HostDev); err != nil {
			return fmt.Errorf("lab: unplug %s: %w", server, err)
		}
	}
	return nil
}

// Plug recreates the server's taps (MACs, addresses, routes as at Up) and
// returns once every running pipeline has attached to them.
func (l *Lab) Plug(ctx context.Context, server string) error {
	s := l.Cloud.Server(server)
	if s == nil {
		return fmt.Errorf("lab: server %q is not in the topology", server)
	}
	for _, p := range s.Ports {
		if len(p.Subports) > 0 {
			return fmt.Errorf("lab: plug %s: a trunk port's VLAN tagging is attached once, at lab up; it cannot be plugged back", server)
		}
	}
	ns := s.Ports[0].HostNS(l.Cloud)
	before := l.attachCounts(ns)
	if err := l.wireServer(ctx, s); err != nil {
		return fmt.Errorf("lab: plug %s: %w", server, err)
	}
	var devs []string
	for _, p := range s.Ports {
		devs = append(devs, p.HostDev)
	}
	return l.waitAttached(ctx, ns, before, devs)
}

// Migrate moves a server to another hypervisor as a live migration looks
// from the network: its taps vanish on the source and appear on the
// destination (same port, MAC and addresses; the guest keeps running and
// its connections survive the gap). It returns once the destination's
// tapflow attached the taps.
func (l *Lab) Migrate(ctx context.Context, server, to string) error {
	s := l.Cloud.Server(server)
	if s == nil {
		return fmt.Errorf("lab: server %q is not in the topology", server)
	}
	dst := l.Cloud.HypervisorNS(to)
	if dst != l.Cloud.HVNS() && !slices.Contains(l.Cloud.Hypervisors, dst) {
		return fmt.Errorf("lab: migrate %s: %q is not a hypervisor of the topology", server, to)
	}
	if s.Ports[0].HostNS(l.Cloud) == dst {
		return fmt.Errorf("lab: migrate %s: it already runs on %s", server, to)
	}
	for _, p := range s.Ports {
		if len(p.Subports) > 0 {
			return fmt.Errorf("lab: migrate %s: a trunk port's VLAN tagging is attached once, at lab up; it cannot move", server)
		}
	}
	if err := l.Unplug(ctx, server); err != nil {
		return err
	}
	for _, p := range s.Ports {
		p.hostNS = dst
	}
	return l.Plug(ctx, server)
}

// attachCounts counts, per pipeline capturing in namespace ns, the
// "attached" log lines per device.
func (l *Lab) attachCounts(ns string) map[*Pipeline]map[string]int {
	l.mu.Lock()
	pipes := append([]*Pipeline(nil), l.pipes...)
	l.mu.Unlock()
	out := map[*Pipeline]map[string]int{}
	for _, p := range pipes {
		if p.ns != ns {
			continue
		}
		n := map[string]int{}
		for _, e := range ReadLog(p.logPath) {
			if e.Msg == "attached" {
				n[e.Ifname]++
			}
		}
		out[p] = n
	}
	return out
}

// waitAttached waits until every pipeline logged one more "attached" for
// each of devs than in before.
func (l *Lab) waitAttached(ctx context.Context, ns string, before map[*Pipeline]map[string]int, devs []string) error {
	deadline := time.Now().Add(attachTimeout)
	for {
		missing := ""
		for p, n := range l.attachCounts(ns) {
			for _, d := range devs {
				if n[d] <= before[p][d] {
					missing = d
				}
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: tapflow did not attach to %s within %s", missing, attachTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Regateway moves a router's external gateway to another external network
// (Neutron's router update of external_gateway_info): a new gateway port
// and address there, the old qg- device deleted, the default route and
// SNAT moved, the inventory rewritten. Routers with floating IPs are
// refused, as Neutron refuses them while the floating IPs use the old
// network.
func (l *Lab) Regateway(ctx context.Context, router, network string) error {
	c := l.Cloud
	r, n := c.Router(router), c.Network(network)
	switch {
	case r == nil:
		return fmt.Errorf("lab: regateway: no router %q", router)
	case n == nil || !n.External:
		return fmt.Errorf("lab: regateway %s: %q is not an external network of the topology", router, network)
	case len(r.FIPs) > 0:
		return fmt.Errorf("lab: regateway %s: the router carries floating IPs on %s; Neutron refuses to move its gateway", router, r.Gateway.Name)
	case l.reg != nil:
		return fmt.Errorf("lab: regateway %s: a registered lab's router is OpenStack's; update it there", router)
	case r.Gateway == n:
		return nil
	}
	var sn *Subnet
	for _, s := range n.Subnets {
		if s.Prefix.Addr().Is4() && s.Gateway.IsValid() {
			sn = s
			break
		}
	}
	if sn == nil {
		return fmt.Errorf("lab: regateway %s: network %s has no IPv4 subnet with a gateway", router, network)
	}
	id := uuid("port", "router-gw/"+r.Name+"/"+n.Name)
	p := &Port{ID: id, Net: n, Owner: "network:router_gateway", DeviceID: r.ID, Inventory: true, MAC: portMAC(id),
		HostDev: "qgh" + id[:11], NS: r.NS, Dev: "qg-" + id[:11]}
	a, ok := sn.alloc("router " + r.Name + " gateway")
	if !ok {
		return fmt.Errorf("lab: regateway %s: subnet %s is full", router, sn.Prefix)
	}
	p.IPs = []FixedIP{{Subnet: sn, Addr: a}}
	old := r.GwPort
	if old != nil {
		if err := l.ip(ctx, c.HVNS(), "link", "del", old.HostDev); err != nil {
			return fmt.Errorf("lab: regateway %s: %w", router, err)
		}
	}
	if err := l.plug(ctx, p, false); err != nil {
		return fmt.Errorf("lab: regateway %s: %w", router, err)
	}
	if err := l.ip(ctx, r.NS, "route", "replace", "default", "via", sn.Gateway.String(), "dev", p.Dev); err != nil {
		return fmt.Errorf("lab: regateway %s: %w", router, err)
	}
	l.mu.Lock()
	r.Gateway, r.GwPort = n, p
	c.Ports = append(slices.DeleteFunc(c.Ports, func(q *Port) bool { return q == old }), p)
	present := maps(l.present)
	l.mu.Unlock()
	// SNAT to the new address (the old table replaced whole).
	rules := "delete table ip tapflow_lab\n" + l.routerNFT(r)
	path := filepath.Join(l.dir, "nft-"+r.Name+".conf")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if _, err := l.nsexec(ctx, r.NS, "nft", "-f", path); err != nil {
		return fmt.Errorf("lab: regateway %s: %w", router, err)
	}
	before := l.swapCounts()
	if err := c.WriteInventory(l.InventoryPath(), present); err != nil {
		return err
	}
	return l.waitSwapped(ctx, before)
}

// swapCounts counts, per running pipeline, its "attribution snapshot
// swapped" log lines.
func (l *Lab) swapCounts() map[*Pipeline]int {
	l.mu.Lock()
	pipes := append([]*Pipeline(nil), l.pipes...)
	l.mu.Unlock()
	out := map[*Pipeline]int{}
	for _, p := range pipes {
		n := 0
		for _, e := range ReadLog(p.logPath) {
			if e.Msg == "attribution snapshot swapped" {
				n++
			}
		}
		out[p] = n
	}
	return out
}

// waitSwapped waits until every pipeline of before swapped in a newer
// attribution snapshot: the inventory change is in effect, as it is in a
// cloud by the time a new VM boots or new connections leave a router (the
// lab acts within milliseconds; without this, a transfer started at once
// races tapflow's inventory poll).
func (l *Lab) waitSwapped(ctx context.Context, before map[*Pipeline]int) error {
	deadline := time.Now().Add(attachTimeout)
	for {
		done := true
		for p, n := range l.swapCounts() {
			if b, ok := before[p]; ok && n <= b {
				done = false
			}
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: tapflow did not take the new inventory within %s", attachTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
