package lab

import (
	"io/fs"
	"net/netip"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// labSnapshot builds a topology's inventory (present: as Cloud.Inventory)
// through the engine's own loader and snapshot builder.
func labSnapshot(t *testing.T, file string, present map[string]bool) (*Cloud, *snapshot.Snapshot) {
	t.Helper()
	data, err := fs.ReadFile(labfiles.FS, file)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(data, file, Options{Prefix: "tst"})
	if err != nil {
		t.Fatal(err)
	}
	body, err := yaml.Marshal(l.Cloud.Inventory(present))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Parse(body, file)
	if err != nil {
		t.Fatalf("the engine rejects the lab's inventory: %v", err)
	}
	return l.Cloud, snapshot.Build(inv, snapshot.Options{Version: 1})
}

// TestLifecycleTopologies: the topologies of the lifecycle, VRRP and trunk
// scenarios give the inventories their scenarios rely on.
func TestLifecycleTopologies(t *testing.T) {
	mac := func(s string) uint64 {
		m, ok := snapshot.ParseMAC(s)
		if !ok {
			t.Fatalf("mac %q", s)
		}
		return m
	}
	attr := func(s *snapshot.Snapshot, vmMAC string, vlan uint16, local, remote string) snapshot.Result {
		in := snapshot.Input{Dir: schemas.DirTX, VMMAC: mac(vmMAC), PeerMAC: mac("fa:16:3e:ff:ff:ff"),
			LocalIP: netip.MustParseAddr(local), RemoteIP: netip.MustParseAddr(remote), VLAN: vlan}
		var r snapshot.Result
		s.Attribute(&in, &r)
		return r
	}
	t.Run("trunk: (MAC, VLAN) names the subport, untagged the parent", func(t *testing.T) {
		c, s := labSnapshot(t, "trunk.yaml", nil)
		if an := s.Anomalies(); len(an) > 0 {
			t.Errorf("anomalies %v (a subport sharing its parent's MAC is no duplicate)", an)
		}
		p := c.Server("vm1").Ports[0]
		if len(p.Subports) != 1 || p.Subports[0].Port.MAC.String() != p.MAC.String() || p.Subports[0].VLAN != 100 {
			t.Fatalf("vm1's subports %+v, want one on VLAN 100 with the parent's MAC", p.Subports)
		}
		if r := attr(s, p.MAC.String(), 100, "10.0.100.11", "10.0.100.12"); r.PortID != p.Subports[0].Port.ID || r.Zone != schemas.ZoneSameTenant {
			t.Errorf("VLAN 100: port %s zone %v, want the subport %s, same_tenant", r.PortID, r.Zone, p.Subports[0].Port.ID)
		}
		if r := attr(s, p.MAC.String(), 0, "10.0.0.11", "10.0.0.12"); r.PortID != p.ID {
			t.Errorf("untagged: port %s, want the parent %s", r.PortID, p.ID)
		}
	})
	t.Run("vrrp: a declared vMAC is its port's, an undeclared one unknown", func(t *testing.T) {
		c, s := labSnapshot(t, "vrrp.yaml", nil)
		if r := attr(s, "00:00:5e:00:01:2a", 0, "10.0.0.11", "10.0.0.13"); r.TenantID != c.Project("acme").ID {
			t.Errorf("declared vMAC: tenant %s, want acme", r.TenantID)
		}
		if r := attr(s, "00:00:5e:00:01:2b", 0, "10.0.0.12", "10.0.0.13"); r.TenantID != schemas.UnknownTenant || r.Zone != schemas.ZoneMiss {
			t.Errorf("undeclared vMAC: tenant %s zone %v, want unknown/miss", r.TenantID, r.Zone)
		}
		if got := c.Server("vm2").Ports[0].GuestMAC().String(); got != "00:00:5e:00:01:2b" {
			t.Errorf("vm2's guest MAC %s", got)
		}
	})
	t.Run("mac-reuse: one owner at a time, both at once is nobody's", func(t *testing.T) {
		c, s := labSnapshot(t, "macreuse.yaml", nil)
		m := c.Server("a1").Ports[0].MAC.String()
		if r := attr(s, m, 0, "10.0.1.11", "10.0.1.12"); r.TenantID != c.Project("acme").ID {
			t.Errorf("before: tenant %s, want acme", r.TenantID)
		}
		_, s = labSnapshot(t, "macreuse.yaml", map[string]bool{"a1": false, "b1": true})
		if r := attr(s, m, 0, "10.0.2.11", "10.0.2.12"); r.TenantID != c.Project("globex").ID {
			t.Errorf("after: tenant %s, want globex", r.TenantID)
		}
		_, s = labSnapshot(t, "macreuse.yaml", map[string]bool{"b1": true})
		if r := attr(s, m, 0, "10.0.2.11", "10.0.2.12"); r.TenantID != schemas.UnknownTenant {
			t.Errorf("both listed: tenant %s, want unknown (duplicate_mac across projects)", r.TenantID)
		}
	})
	t.Run("migrate: a second hypervisor", func(t *testing.T) {
		c, _ := labSnapshot(t, "migrate.yaml", nil)
		if got := c.Server("vm2").Ports[0].HostNS(c); got != "tst-hv-hv2" {
			t.Errorf("vm2's tap is in %s, want tst-hv-hv2", got)
		}
		if got := c.Server("vm1").Ports[0].HostNS(c); got != c.HVNS() {
			t.Errorf("vm1's tap is in %s, want %s", got, c.HVNS())
		}
		if ns := c.Namespaces(); ns[0] != "tst-hv" || ns[1] != "tst-hv-hv2" {
			t.Errorf("namespaces %v: the hypervisors first", ns)
		}
	})
}

func TestBadLifecycleTopology(t *testing.T) {
	const head = `projects: [t1]
networks:
  - {name: net1, project: t1, subnets: [{cidr: 10.0.0.0/24}]}
  - {name: net2, project: t1, subnets: [{cidr: 10.0.2.0/24}]}
`
	cases := []struct{ name, yaml, want string }{
		{"unknown host", head + "servers:\n  - {name: vm1, project: t1, host: hv9, ports: [{network: net1}]}\n", `host "hv9" is not a hypervisor`},
		{"duplicate hypervisor", head + "hypervisors: [hv2, hv2]\nservers: []\n", "duplicate hypervisor name"},
		{"VLAN out of range", head + "servers:\n  - {name: vm1, project: t1, ports: [{network: net1, subports: [{network: net2, vlan: 4095}]}]}\n", "give a VLAN id 1-4094"},
		{"subport on the parent's network", head + "servers:\n  - {name: vm1, project: t1, ports: [{network: net1, subports: [{network: net1, vlan: 10}]}]}\n", "must differ from its parent's"},
		{"bad wire_mac", head + "servers:\n  - {name: vm1, project: t1, ports: [{network: net1, wire_mac: \"01:00:5e:00:00:01\"}]}\n", "wire_mac"},
		{"same MAC twice on a network", head + "servers:\n  - {name: vm1, project: t1, ports: [{network: net1, mac: \"fa:16:3e:00:00:01\"}]}\n  - {name: vm2, project: t1, ports: [{network: net1, mac: \"fa:16:3e:00:00:01\"}]}\n", "used by two ports of network net1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New([]byte(c.yaml), "t.yaml", Options{Prefix: "tst"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want it to say %q", err, c.want)
			}
		})
	}
}
