package nodeview_test

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/schemas"
)

var testKey = []byte("0123456789abcdef-nodeview-test")

// bind sets binding:host_id the way Nova and Neutron do: a VM's ports
// (one device id) on one of nodes compute hosts, router and DHCP ports on
// the network node "net0", load balancer VIP ports (owner Octavia: an
// address pair, not a VIF) unbound.
func bind(inv *inventory.Inventory, nodes int) {
	parent := map[string]string{} // subport → trunk parent
	for _, t := range inv.Trunks {
		for _, s := range t.SubPorts {
			parent[s.PortID] = t.PortID
		}
	}
	host := func(p *inventory.Port) string {
		switch {
		case p.DeviceOwner == "Octavia" || p.DeviceOwner == "":
			return ""
		case strings.HasPrefix(p.DeviceOwner, "network:"):
			return "net0"
		}
		h := fnv.New32a()
		h.Write([]byte(p.DeviceID))
		return fmt.Sprintf("cmp%03d", h.Sum32()%uint32(nodes))
	}
	byID := map[string]*inventory.Port{}
	for i := range inv.Ports {
		byID[inv.Ports[i].ID] = &inv.Ports[i]
	}
	for i := range inv.Ports {
		p := &inv.Ports[i]
		if par, ok := byID[parent[p.ID]]; ok {
			p.BindingHostID = host(par)
			continue
		}
		p.BindingHostID = host(p)
	}
}

// corpus is every inventory the exactness test runs on: the attribution
// rules' test cloud, docs/inventory.md's complete example, and the
// synthetic generator's cloud with IPv6 and load balancers.
func corpus(t testing.TB) map[string]*inventory.Inventory {
	t.Helper()
	cloud, err := inventory.Load("../snapshot/testdata/cloud.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/inventory.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(doc), "## Complete example")
	_, block, _ := strings.Cut(after, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	example, err := inventory.Parse([]byte(block), "docs/inventory.md")
	if err != nil {
		t.Fatal(err)
	}
	gen := synth.Generate(synth.Options{Tenants: 24, VMsPerTenant: 6, LoadBalancers: 6, WithIPv6: true, ExternalNetworks: 2, FloatingIPsPerTenant: 2})
	return map[string]*inventory.Inventory{"cloud.yaml": cloud, "inventory.md": example, "synth": gen}
}

// addrs lists the addresses a record's far end can have: every port's
// fixed IPs and address pairs, gateways, VIPs, floating IPs, route
// destinations and next hops, amphora addresses, the metadata service
// and two Internet addresses.
func addrs(inv *inventory.Inventory) []netip.Addr {
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	add := func(s string) {
		a, err := netip.ParseAddr(s)
		if err != nil || seen[a] {
			return
		}
		seen[a] = true
		out = append(out, a)
	}
	for _, p := range inv.Ports {
		for _, f := range p.FixedIPs {
			add(f.IPAddress)
		}
		for _, a := range p.AllowedAddressPairs {
			add(strings.Split(a.IPAddress, "/")[0])
		}
	}
	for _, s := range inv.Subnets {
		add(s.GatewayIP)
		if p, err := netip.ParsePrefix(s.CIDR); err == nil {
			add(p.Addr().Next().Next().Next().String())
		}
	}
	for _, r := range inv.Routers {
		for _, rt := range r.Routes {
			add(rt.NextHop)
			if p, err := netip.ParsePrefix(rt.Destination); err == nil {
				add(p.Addr().Next().String())
			}
		}
	}
	for _, f := range inv.FloatingIPs {
		add(f.FloatingIPAddress)
	}
	for _, l := range inv.LoadBalancers {
		add(l.VIPAddress)
	}
	for _, a := range inv.Amphorae {
		add(a.LBNetworkIP)
		add(a.VRRPIP)
	}
	for _, s := range []string{"8.8.8.8", "2001:4860:4860::8888", "169.254.169.254"} {
		add(s)
	}
	return out
}

// peer is a far end: a MAC and the addresses tried with it.
type peer struct {
	mac   uint64
	addrs []netip.Addr
}

// peers are every port's MAC with its own addresses and a foreign one
// (an address pair or a stale ARP entry), and a MAC no port has (a
// router's on another node, the prefix rules decide) with every address.
func peers(inv *inventory.Inventory, far []netip.Addr) []peer {
	var out []peer
	for _, p := range inv.Ports {
		m, ok := snapshot.ParseMAC(p.MACAddress)
		if !ok {
			continue
		}
		pe := peer{mac: m, addrs: []netip.Addr{far[len(out)%len(far)], netip.MustParseAddr("8.8.4.4"), netip.MustParseAddr("2001:db8::9")}}
		for _, f := range p.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil {
				pe.addrs = append(pe.addrs, a)
			}
		}
		out = append(out, pe)
		for _, a := range p.AllowedAddressPairs {
			ip, err := netip.ParseAddr(strings.Split(a.IPAddress, "/")[0])
			if err != nil {
				continue
			}
			pe := peer{mac: m, addrs: []netip.Addr{ip}}
			if am, ok := snapshot.ParseMAC(a.MACAddress); ok {
				pe.mac = am
			}
			out = append(out, pe)
		}
	}
	return append(out, peer{mac: 0x02_00_00_00_00_99, addrs: far})
}

// records are the inputs of one node: for every port bound to it (by its
// MAC, and by its trunk VLANs), every peer, both directions, and
// multicast (received: by tap).
func records(inv *inventory.Inventory, node string, far []netip.Addr, nowUS int64) []snapshot.Input {
	ps := peers(inv, far)
	vlans := map[string][]uint16{}
	for _, t := range inv.Trunks {
		for _, s := range t.SubPorts {
			vlans[t.PortID] = append(vlans[t.PortID], uint16(s.SegmentationID))
		}
	}
	var out []snapshot.Input
	for _, p := range inv.Ports {
		if p.BindingHostID != node {
			continue
		}
		vm, ok := snapshot.ParseMAC(p.MACAddress)
		if !ok {
			continue
		}
		var local []netip.Addr
		for _, f := range p.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil {
				local = append(local, a)
			}
		}
		if len(local) == 0 {
			local = []netip.Addr{{}}
		}
		tags := append([]uint16{0}, vlans[p.ID]...)
		for _, vlan := range tags {
			for _, l := range local {
				for _, pe := range ps {
					for _, r := range pe.addrs {
						if l.IsValid() && l.Is4() != r.Is4() {
							continue
						}
						for _, dir := range []schemas.Direction{schemas.DirTX, schemas.DirRX} {
							out = append(out, snapshot.Input{Dir: dir, VMMAC: vm, PeerMAC: pe.mac, LocalIP: l, RemoteIP: r, LocalPort: 80, RemotePort: 40000, VLAN: vlan, NowUS: nowUS})
						}
					}
				}
			}
		}
		group := uint64(0x01_00_5e_00_00_01)
		out = append(out,
			snapshot.Input{Dir: schemas.DirRX, VMMAC: group, PeerMAC: ps[0].mac, LocalIP: netip.MustParseAddr("224.0.0.1"), RemoteIP: local[0], NowUS: nowUS, Tap: "tap" + p.ID[:min(11, len(p.ID))]},
			snapshot.Input{Dir: schemas.DirTX, VMMAC: vm, PeerMAC: group, LocalIP: local[0], RemoteIP: netip.MustParseAddr("224.0.0.1"), NowUS: nowUS})
	}
	return out
}

// TestViewAttributesLikeFull is the exactness of node-scoped views:
// every record a node's agent can capture is attributed from the node's
// view exactly as from the whole inventory, field by field, on every node
// of every inventory of the corpus.
func TestViewAttributesLikeFull(t *testing.T) {
	b, err := nodeview.New(testKey)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	for name, inv := range corpus(t) {
		t.Run(name, func(t *testing.T) {
			bind(inv, 5)
			opt := snapshot.Options{Version: 7, Now: now}
			full := snapshot.Build(inv, opt)
			far := addrs(inv)
			nodes := nodeview.Nodes(inv)
			if len(nodes) < 3 {
				t.Fatalf("only %d nodes: the corpus does not exercise remote ends", len(nodes))
			}
			checked := 0
			for _, node := range nodes {
				view := snapshot.Build(b.View(inv, node), opt)
				var want, got snapshot.Result
				for _, in := range records(inv, node, far, now.UnixMicro()) {
					full.Attribute(&in, &want)
					view.Attribute(&in, &got)
					if got != want {
						t.Fatalf("node %s, record %+v:\n view %+v\n full %+v", node, in, got, want)
					}
					checked++
				}
			}
			t.Logf("%d records on %d nodes attributed alike", checked, len(nodes))
		})
	}
}

// TestViewHidesTheRest checks what a view drops: no other node's host,
// server, name, floating IP or port id; and that a change elsewhere that
// touches none of what the view holds leaves it equal.
func TestViewHidesTheRest(t *testing.T) {
	b, err := nodeview.New(testKey)
	if err != nil {
		t.Fatal(err)
	}
	inv := corpus(t)["synth"]
	bind(inv, 5)
	const node = "cmp001"
	v := b.View(inv, node)
	own := map[string]bool{}
	for _, p := range inv.Ports {
		if p.BindingHostID == node {
			own[p.ID] = true
		}
	}
	if len(own) == 0 {
		t.Fatal("node has no port")
	}
	for i, p := range v.Ports {
		orig := inv.Ports[i]
		if own[orig.ID] {
			if !reflect.DeepEqual(p, orig) {
				t.Errorf("own port %s not whole: %+v", orig.ID, p)
			}
			continue
		}
		// a load balancer's VIP port keeps its id when the LB has an
		// amphora here (vip_port_id names it)
		if p.BindingHostID != "" || p.Name != "" || (p.ID == orig.ID && orig.DeviceOwner != "Octavia") || (p.DeviceID != "" && p.DeviceID == orig.DeviceID) {
			t.Errorf("port %s of another node shows %+v", orig.ID, p)
		}
	}
	for _, s := range v.Servers {
		if !own["vm-"+strings.TrimPrefix(s.ID, "srv-vm-")] && !ownDevice(inv, node, s.ID) {
			t.Errorf("server %s of another node in the view", s.ID)
		}
	}
	for _, f := range v.FloatingIPs {
		if !own[f.PortID] {
			t.Errorf("floating IP %s of another node in the view", f.ID)
		}
	}
	// Renaming another node's VM, moving it to a third node and changing
	// its availability zone does not change the view.
	changed := *inv
	changed.Ports = append([]inventory.Port(nil), inv.Ports...)
	changed.Servers = append([]inventory.Server(nil), inv.Servers...)
	for i := range changed.Ports {
		if p := &changed.Ports[i]; p.BindingHostID != node && strings.HasPrefix(p.DeviceOwner, "compute:") {
			p.Name, p.BindingHostID, p.DeviceOwner = "renamed", "cmp999", "compute:az9"
			break
		}
	}
	for i := range changed.Servers {
		if !ownDevice(inv, node, changed.Servers[i].ID) {
			changed.Servers[i].Name = "renamed"
		}
	}
	if !reflect.DeepEqual(b.View(&changed, node), v) {
		t.Error("a change the view does not hold changed it")
	}
	other, _ := nodeview.New([]byte("another key, 16 bytes or more"))
	if reflect.DeepEqual(other.View(inv, node), v) {
		t.Error("pseudonyms do not depend on the key")
	}
	if _, err := nodeview.New([]byte("short")); err == nil {
		t.Error("a 5-byte key was accepted")
	}
}

func ownDevice(inv *inventory.Inventory, node, dev string) bool {
	for _, p := range inv.Ports {
		if p.DeviceID == dev && p.BindingHostID == node {
			return true
		}
	}
	return false
}

// TestOverlayMergesToView checks how a view travels: the shared view and
// a node's overlay merge into exactly View(inv, node), on every node of
// every inventory of the corpus; and an overlay names none of another
// node's ports.
func TestOverlayMergesToView(t *testing.T) {
	b, err := nodeview.New(testKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, inv := range corpus(t) {
		t.Run(name, func(t *testing.T) {
			bind(inv, 5)
			x := b.NewIndex(inv)
			if !reflect.DeepEqual(x.Shared(), b.View(inv, "")) {
				t.Fatal("shared view is not View(inv, \"\")")
			}
			again := b.NewIndex(inv)
			for _, node := range x.Nodes() {
				o := x.Overlay(node)
				// equal overlays encode equally: the service compares
				// encodings to publish only the changed ones
				e1, err1 := nodeview.Encode(o)
				e2, err2 := nodeview.Encode(again.Overlay(node))
				if err1 != nil || err2 != nil || !bytes.Equal(e1, e2) {
					t.Fatalf("node %s: one overlay, two encodings (%v, %v)", node, err1, err2)
				}
				if back, err := nodeview.Decode(e1); err != nil || !reflect.DeepEqual(back, o) {
					t.Fatalf("node %s: overlay does not decode to itself: %v", node, err)
				}
				got, want := nodeview.Merge(x.Shared(), o), b.View(inv, node)
				if !reflect.DeepEqual(got, want) {
					diff(t, node, got, want)
				}
				for _, p := range o.Ports {
					if p.BindingHostID != node && p.BindingHostID != "" {
						t.Errorf("overlay of %s holds port %s of %s", node, p.ID, p.BindingHostID)
					}
				}
			}
		})
	}
}

// diff reports the first list where got and want differ.
func diff(t *testing.T, node string, got, want *inventory.Inventory) {
	t.Helper()
	g, w := reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem()
	for i := 0; i < g.NumField(); i++ {
		if !reflect.DeepEqual(g.Field(i).Interface(), w.Field(i).Interface()) {
			gl, wl := g.Field(i), w.Field(i)
			for j := 0; j < max(gl.Len(), wl.Len()); j++ {
				if j >= gl.Len() || j >= wl.Len() || !reflect.DeepEqual(gl.Index(j).Interface(), wl.Index(j).Interface()) {
					var ge, we any
					if j < gl.Len() {
						ge = gl.Index(j).Interface()
					}
					if j < wl.Len() {
						we = wl.Index(j).Interface()
					}
					t.Fatalf("node %s: %s[%d] (of %d, want %d):\n merged %+v\n view   %+v", node, g.Type().Field(i).Name, j, gl.Len(), wl.Len(), ge, we)
				}
			}
			t.Fatalf("node %s: %s differs (nil vs empty?)", node, g.Type().Field(i).Name)
		}
	}
}
