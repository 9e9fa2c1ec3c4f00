package lab

import (
	"io/fs"
	"net/netip"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

const okTopology = `projects: [t1]
networks:
  - name: public
    external: true
    subnets: [{cidr: 203.0.113.0/24}]
  - name: net1
    project: t1
    subnets: [{cidr: 10.0.0.0/24}]
routers:
  - {name: r1, project: t1, gateway: public, interfaces: [net1]}
servers:
  - {name: vm1, project: t1, ports: [{network: net1}]}
`

// TestBadTopology: every kind of bad input is rejected before anything
// is created, with the file, the line and the object.
func TestBadTopology(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"unknown network", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - name: vm1
    project: t1
    ports: [{network: nte1}]
`, []string{"t.yaml:7: servers[0].ports[0] (vm1)", `network "nte1" is not defined; defined: net1`}},
		{"duplicate server", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - {name: vm1, project: t1, ports: [{network: net1}]}
  - {name: vm1, project: t1, ports: [{network: net1}]}
`, []string{"t.yaml:6: servers[1] (vm1): duplicate server name"}},
		{"bad routes", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
routers:
  - {name: r1, project: t1, interfaces: [net1], routes: [{destination: 10.9.0.0, nexthop: 10.0.0.5}]}
servers:
  - {name: vm1, project: t1, ports: [{network: net1}], routes: [{destination: 10.8.0.0/16, nexthop: 10.5.0.1}]}
`, []string{`routers[0].routes[0] (r1): route needs destination (a CIDR) and nexthop (an address): "10.9.0.0" via "10.0.0.5"`,
			"servers[0].routes[0] (vm1): nexthop 10.5.0.1 is on none of the server's networks"}},
		{"duplicate network", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
  - {name: net1, project: t1, subnets: [{cidr: 10.0.1.0/24}]}
`, []string{"t.yaml:4: networks[1] (net1): duplicate network name"}},
		{"address outside its subnet", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - {name: vm1, project: t1, ports: [{network: net1, ips: [10.0.3.5]}]}
`, []string{"t.yaml:5: servers[0].ports[0] (server vm1): address 10.0.3.5 is outside every subnet of network net1 (10.0.0.0/24)"}},
		{"address used twice", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - {name: vm1, project: t1, ports: [{network: net1, ips: [10.0.0.5]}]}
  - {name: vm2, project: t1, ports: [{network: net1, ips: [10.0.0.5]}]}
`, []string{"t.yaml:6: servers[1].ports[0] (server vm2): address 10.0.0.5 is already used by server vm1"}},
		{"unknown project", `networks:
  - {name: net1, project: nobody, subnets: [{cidr: 10.0.0.0/24}]}
`, []string{"t.yaml:2: networks[0] (net1)", `project "nobody" is not defined`}},
		{"unknown key", `projects: [t1]
networks:
  - {name: net1, project: t1, subnet: [{cidr: 10.0.0.0/24}]}
`, []string{"line 3: field subnet not found"}},
		{"unknown key in a port", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - name: vm1
    project: t1
    ports:
      - network: net1
        floating_ip: {network: public, adress: 1.2.3.4}
`, []string{"line 9", "field adress not found"}},
		{"floating IP without a router", `projects: [t1]
networks:
  - {name: public, external: true, subnets: [{cidr: 203.0.113.0/24}]}
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - {name: vm1, project: t1, ports: [{network: net1, floating_ip: public}]}
`, []string{"servers[0].ports[0].floating_ip (vm1): no router has gateway public and an interface on net1"}},
		{"router gateway not external", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
routers:
  - {name: r1, project: t1, gateway: net1}
`, []string{"t.yaml:5: routers[0] (r1): gateway net1 is not an external network"}},
		{"overlapping subnets on a router", `projects: [t1]
networks:
  - {name: a, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
  - {name: b, project: t1, subnets: [{cidr: 10.0.0.0/25, gateway: 10.0.0.126}]}
routers:
  - {name: r1, project: t1, interfaces: [a, b]}
`, []string{"routers[0].interfaces[1] (r1): subnet 10.0.0.0/25 of b overlaps subnet 10.0.0.0/24 of a"}},
		{"bad cidr", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.1/24}]}
`, []string{"t.yaml:3: networks[0].subnets[0] (net1): cidr 10.0.0.1/24 has host bits set; use 10.0.0.0/24"}},
		{"member not a server", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
loadbalancers:
  - {name: lb, project: t1, vip: {network: net1}, members: [ghost]}
`, []string{"loadbalancers[0].members[0] (lb): member server \"ghost\" is not defined"}},
		{"bad name", `projects: [T1]
`, []string{"projects[0] (T1): project name must match"}},
		{"bad loopback", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - {name: fw1, project: t1, ports: [{network: net1}], loopback: [10.9.0.1/32, 10.0.0.99]}
`, []string{`servers[0].loopback[0] (fw1): loopback "10.9.0.1/32" is not an address`,
			"servers[0].loopback[1] (fw1): loopback 10.0.0.99 is inside subnet 10.0.0.0/24 of network net1"}},
		{"several problems at once", `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
servers:
  - {name: vm1, project: t2, ports: [{network: net2}]}
`, []string{`project "t2" is not defined`, `network "net2" is not defined`, "nothing was created"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New([]byte(c.yaml), "t.yaml", Options{Prefix: "tst"})
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestBadPrefix(t *testing.T) {
	for _, p := range []string{"", "1ab", "a-b", "Tfl", "abcdefghijklm"} {
		if _, err := New([]byte(okTopology), "t.yaml", Options{Prefix: p}); err == nil && p != "" {
			t.Errorf("prefix %q accepted", p)
		}
	}
}

// TestResolveIsDeterministic: the same topology gives the same IDs, MACs,
// addresses and device names (lab drive and down rely on it), names follow
// Nova/Neutron, and prefixes only change namespace names.
func TestResolveIsDeterministic(t *testing.T) {
	a, err := New([]byte(okTopology), "t.yaml", Options{Prefix: "aa"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New([]byte(okTopology), "t.yaml", Options{Prefix: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Cloud.Ports) != len(b.Cloud.Ports) {
		t.Fatal("port counts differ")
	}
	for i, p := range a.Cloud.Ports {
		q := b.Cloud.Ports[i]
		if p.ID != q.ID || p.MAC.String() != q.MAC.String() || p.HostDev != q.HostDev || len(p.IPs) != len(q.IPs) {
			t.Errorf("port %d differs: %+v vs %+v", i, p, q)
		}
		if p.HostDev != "" && len(p.HostDev) > 15 {
			t.Errorf("device name %s longer than IFNAMSIZ-1", p.HostDev)
		}
	}
	vm := a.Cloud.Server("vm1").Ports[0]
	if vm.HostDev != "tap"+vm.ID[:11] || !strings.HasPrefix(vm.MAC.String(), "fa:16:3e:") {
		t.Errorf("tap %s / MAC %s: want tap<id[:11]> and fa:16:3e:…", vm.HostDev, vm.MAC)
	}
	if got := vm.V4(); got != netip.MustParseAddr("10.0.0.10") {
		t.Errorf("first auto address %s, want 10.0.0.10", got)
	}
	if a.Cloud.Server("vm1").NS != "aa-vm-vm1" || b.Cloud.HVNS() != "bb-hv" {
		t.Errorf("namespaces %s %s", a.Cloud.Server("vm1").NS, b.Cloud.HVNS())
	}
	for _, n := range a.Cloud.Namespaces() {
		if !strings.HasPrefix(n, "aa-") {
			t.Errorf("namespace %s outside the prefix", n)
		}
	}
}

// TestDemoInventory: the demo cloud's inventory parses as a file the
// engine reads, builds without anomalies, and attributes the seed's
// Octavia flows as the seed table says (the same rules the e2e scenario
// then checks on real packets).
func TestDemoInventory(t *testing.T) {
	data, err := fs.ReadFile(labfiles.FS, "demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(data, "demo.yaml", Options{Prefix: "tst"})
	if err != nil {
		t.Fatal(err)
	}
	c := l.Cloud
	body, err := yaml.Marshal(c.Inventory(nil))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Parse(body, "demo inventory")
	if err != nil {
		t.Fatalf("the engine rejects the lab's inventory: %v", err)
	}
	snap := snapshot.Build(inv, snapshot.Options{Version: 1})
	if an := snap.Anomalies(); len(an) > 0 {
		t.Errorf("anomalies: %v", an)
	}
	lb := c.LB("web-lb")
	amp := lb.Amphorae[0]
	acme, globex := c.Project("acme"), c.Project("globex")
	client, gclient := c.Server("acme-client").Ports[0], c.Server("globex-client").Ports[0]
	app1 := c.Server("app1").Ports[0]
	var memberPort *Port
	for _, p := range amp.Ports {
		if p.Net.Name == "app" {
			memberPort = p
		}
	}
	if memberPort == nil || memberPort.Owner != "compute:nova" || memberPort.DeviceID != amp.ComputeID {
		t.Fatalf("amphora has no unmarked member-network port: %+v", memberPort)
	}
	routerMAC := c.Router("acme-router").Ifaces[0].MAC.String()
	cases := []struct {
		name                    string
		dir, vm, peer, src, dst string
		tenant, zone, ext       string
		seg                     int32
	}{
		{"T1 client → VIP at the client's tap", "tx", client.MAC.String(), amp.VRRP.MAC.String(), client.V4().String(), lb.VIP.String(), acme.ID, "same_tenant", "none", 1},
		{"T1 client → VIP at the amphora", "rx", amp.VRRP.MAC.String(), client.MAC.String(), client.V4().String(), lb.VIP.String(), acme.ID, "same_tenant", "none", 1},
		{"T2 client → VIP at the amphora", "rx", amp.VRRP.MAC.String(), gclient.MAC.String(), gclient.V4().String(), lb.VIP.String(), acme.ID, "other_tenant", "none", 1},
		{"T2 client → VIP at its tap", "tx", gclient.MAC.String(), amp.VRRP.MAC.String(), gclient.V4().String(), lb.VIP.String(), globex.ID, "other_tenant", "none", 1},
		{"internet → FIP → VIP at the amphora", "rx", amp.VRRP.MAC.String(), routerMAC, "198.51.100.10", lb.VIP.String(), acme.ID, "external", "public", 1},
		{"amphora → app1 (segment 2) at the amphora", "tx", memberPort.MAC.String(), app1.MAC.String(), memberPort.V4().String(), app1.V4().String(), acme.ID, "infra", "none", 2},
		{"amphora → app1 (segment 2) at app1", "rx", app1.MAC.String(), memberPort.MAC.String(), memberPort.V4().String(), app1.V4().String(), acme.ID, "infra", "none", 2},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			f := schemas.Flow{Direction: k.dir, VMMAC: k.vm, PeerMAC: k.peer, SrcIP: k.src, DstIP: k.dst}
			var in snapshot.Input
			if err := snapshot.ParseFlow(&f, 0, &in); err != nil {
				t.Fatal(err)
			}
			var r snapshot.Result
			snap.Attribute(&in, &r)
			if r.TenantID != k.tenant || r.Zone.String() != k.zone || r.ExternalNetwork != k.ext || r.LBSegment != k.seg {
				t.Errorf("got tenant %s zone %s ext %s seg %d; want %s %s %s %d", c.tenantName(r.TenantID), r.Zone, r.ExternalNetwork, r.LBSegment,
					c.tenantName(k.tenant), k.zone, k.ext, k.seg)
			}
		})
	}
}

// TestExtrarouteInventory: extraroute.yaml's inventory through the real
// snapshot builder gives, for vm1's packets to the networks behind each
// extraroute's next hop, the resolver's zones (§1.8) that the
// extraroute-* scenarios then check on real packets: the appliance's
// network zone (same_tenant on acme's transit, shared on admin's shared
// dmz), and external with one dangling_route anomaly for the next hop no
// port holds. The appliances hold those addresses on lo.
func TestExtrarouteInventory(t *testing.T) {
	data, err := fs.ReadFile(labfiles.FS, "extraroute.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(data, "extraroute.yaml", Options{Prefix: "tst"})
	if err != nil {
		t.Fatal(err)
	}
	c := l.Cloud
	if got := c.Server("fw1").Loopback; len(got) != 1 || got[0] != netip.MustParseAddr("10.9.0.1") {
		t.Errorf("fw1 loopback %v, want [10.9.0.1]", got)
	}
	body, err := yaml.Marshal(c.Inventory(nil))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Parse(body, "extraroute inventory")
	if err != nil {
		t.Fatalf("the engine rejects the lab's inventory: %v", err)
	}
	snap := snapshot.Build(inv, snapshot.Options{Version: 1})
	an := snap.Anomalies()
	if len(an) != 1 || an[0].Class != snapshot.AnomalyDanglingRoute || !strings.Contains(an[0].Detail, "10.7.0.0/16") {
		t.Errorf("anomalies %v, want one dangling_route for 10.7.0.0/16", an)
	}
	vm1 := c.Server("vm1").Ports[0]
	r1 := c.Router("r1").Ifaces[0].MAC.String()
	for dst, zone := range map[string]string{"10.9.0.1": "same_tenant", "10.8.0.1": "shared", "10.7.0.1": "external", "10.6.0.1": "external"} {
		f := schemas.Flow{Direction: "tx", VMMAC: vm1.MAC.String(), PeerMAC: r1, SrcIP: vm1.V4().String(), DstIP: dst}
		var in snapshot.Input
		if err := snapshot.ParseFlow(&f, 0, &in); err != nil {
			t.Fatal(err)
		}
		var r snapshot.Result
		snap.Attribute(&in, &r)
		if r.TenantID != c.Project("acme").ID || r.Zone.String() != zone {
			t.Errorf("vm1 → %s: tenant %s zone %s, want acme %s", dst, c.tenantName(r.TenantID), r.Zone, zone)
		}
	}
}

// TestInventoryPresence: ports with inventory: false, and servers taken
// out or put back, are what the file lists.
func TestInventoryPresence(t *testing.T) {
	data, err := fs.ReadFile(labfiles.FS, "basic.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(data, "basic.yaml", Options{Prefix: "tst"})
	if err != nil {
		t.Fatal(err)
	}
	has := func(inv *inventory.Inventory, server string) (bool, bool) {
		s := l.Cloud.Server(server)
		var port, srv bool
		for _, p := range inv.Ports {
			port = port || p.ID == s.Ports[0].ID
		}
		for _, x := range inv.Servers {
			srv = srv || x.ID == s.ID
		}
		return port, srv
	}
	for _, c := range []struct {
		present map[string]bool
		server  string
		want    bool
	}{
		{nil, "vm1", true},
		{nil, "vm3", false},
		{map[string]bool{"vm3": true}, "vm3", true},
		{map[string]bool{"vm2": false}, "vm2", false},
	} {
		p, s := has(l.Cloud.Inventory(c.present), c.server)
		if p != c.want || s != c.want {
			t.Errorf("present %v: %s port %v server %v, want %v", c.present, c.server, p, s, c.want)
		}
	}
}

// TestScenariosLoad: every built-in scenario and topology parses and
// resolves (names in steps and expectations exist).
func TestScenariosLoad(t *testing.T) {
	names, err := ListScenarios(labfiles.FS, "scenarios")
	if err != nil || len(names) < 15 {
		t.Fatalf("scenarios: %v (%d)", err, len(names))
	}
	for _, n := range names {
		if _, err := LoadScenario(labfiles.FS, n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	tops, _ := fs.Glob(labfiles.FS, "*.yaml")
	for _, n := range tops {
		data, _ := fs.ReadFile(labfiles.FS, n)
		if _, err := New(data, n, Options{Prefix: "tst"}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// TestEvaluate pins the expectation arithmetic: payload bounds, noise,
// and coverage.
func TestEvaluate(t *testing.T) {
	l, err := New([]byte(okTopology), "t.yaml", Options{Prefix: "tst"})
	if err != nil {
		t.Fatal(err)
	}
	t1 := l.Cloud.Project("t1").ID
	rec := func(zone, dir string, b int64) schemas.Flow {
		return schemas.Flow{TenantID: t1, Zone: zone, Direction: dir, ExternalNetwork: "none", Bytes: b}
	}
	const mib = 1 << 20
	cases := []struct {
		name   string
		flows  []schemas.Flow
		expect []Expect
		fails  int
	}{
		{"exact payload", []schemas.Flow{rec("same_tenant", "tx", mib)}, []Expect{{Tenant: "t1", Zone: "same_tenant", Dir: "tx", Bytes: mib}}, 0},
		{"short", []schemas.Flow{rec("same_tenant", "tx", mib-1)}, []Expect{{Tenant: "t1", Zone: "same_tenant", Dir: "tx", Bytes: mib}}, 1},
		{"over 1.15×+64KiB", []schemas.Flow{rec("same_tenant", "tx", mib*115/100+64<<10+1)}, []Expect{{Tenant: "t1", Zone: "same_tenant", Dir: "tx", Bytes: mib}}, 1},
		{"noise under 64KiB", []schemas.Flow{rec("same_tenant", "tx", mib), rec("multicast", "tx", 64<<10)}, []Expect{{Tenant: "t1", Zone: "same_tenant", Dir: "tx", Bytes: mib}}, 0},
		{"unexpected growth", []schemas.Flow{rec("same_tenant", "tx", mib), rec("external", "tx", 64<<10+1)}, []Expect{{Tenant: "t1", Zone: "same_tenant", Dir: "tx", Bytes: mib}}, 1},
		{"max 0", []schemas.Flow{rec("infra", "rx", 1)}, []Expect{{Tenant: "t1", Zone: "infra", Max: new(units.ByteSize)}}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc := &Scenario{Expect: c.expect, Noise: 64 << 10}
			n := 0
			for _, ch := range sc.Evaluate(l.Cloud, c.flows) {
				if !ch.OK {
					n++
				}
			}
			if n != c.fails {
				t.Errorf("%d failed checks, want %d: %v", n, c.fails, sc.Evaluate(l.Cloud, c.flows))
			}
		})
	}
}

// TestConservation pins the comparison with the kernel meters.
func TestConservation(t *testing.T) {
	f := func(tap, dir string, b, p int64, seq int64) schemas.Flow {
		return schemas.Flow{Ifname: tap, Direction: dir, Bytes: b, Packets: p, AgentID: "a", BatchSeq: seq, MetadataVersion: 1}
	}
	m := func(tap, dir string, b, p, lost int64) *Meter {
		lp := int64(0)
		if lost > 0 {
			lp = 1
		}
		return &Meter{Ifname: tap, Direction: dir, Bytes: b, Packets: p, LostBytes: lost, LostPackets: lp}
	}
	cases := []struct {
		name   string
		flows  []schemas.Flow
		meters []*Meter
		ok     bool
	}{
		{"exact", []schemas.Flow{f("tap1", "tx", 100, 2, 1), f("tap1", "tx", 50, 1, 2)}, []*Meter{m("tap1", "tx", 150, 3, 0)}, true},
		{"a byte short", []schemas.Flow{f("tap1", "tx", 149, 3, 1)}, []*Meter{m("tap1", "tx", 150, 3, 0)}, false},
		{"lost", []schemas.Flow{f("tap1", "tx", 100, 2, 1)}, []*Meter{m("tap1", "tx", 150, 3, 50)}, false},
		{"duplicate record", []schemas.Flow{f("tap1", "tx", 75, 1, 1), f("tap1", "tx", 75, 2, 1)}, []*Meter{m("tap1", "tx", 150, 3, 0)}, false},
		{"records without a meter", []schemas.Flow{f("tap1", "tx", 150, 3, 1), f("tap2", "rx", 1, 1, 2)}, []*Meter{m("tap1", "tx", 150, 3, 0)}, false},
		{"no meters at all", nil, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ms := map[[2]string]*Meter{}
			for _, x := range c.meters {
				ms[[2]string{x.Ifname, x.Direction}] = x
			}
			if got := CheckConservation(c.flows, ms); got.OK() != c.ok {
				t.Errorf("OK() = %v, want %v: %s", got.OK(), c.ok, got)
			}
		})
	}
}
