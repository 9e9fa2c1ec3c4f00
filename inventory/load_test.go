package inventory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		wantErr []string // substrings of the error; none: must parse
		check   func(t *testing.T, inv *Inventory)
	}{
		{name: "empty file is rejected", in: "", wantErr: []string{"empty inventory", "{} for a cloud that is really empty"}},
		{name: "whitespace and comments only are rejected", in: "\n  \n# written by cron\n", wantErr: []string{"empty inventory"}},
		{name: "null document is rejected", in: "~\n", wantErr: []string{"empty inventory"}},
		{name: "{} is an empty cloud", in: "{}\n", check: func(t *testing.T, inv *Inventory) {
			if len(inv.Ports)+len(inv.Networks) != 0 {
				t.Errorf("not empty: %+v", inv)
			}
		}},
		{name: "truncated JSON is rejected", in: `{"ports": [{"id": "p1", "mac_address": "fa:16:3e:00:00:01"}, {"id": "p2", "mac_`, wantErr: []string{"inventory t:"}},
		{name: "JSON cut after a complete object is rejected", in: `{"ports": [{"id": "p1"}`, wantErr: []string{"inventory t:"}},
		{name: "YAML with API field names", in: `
networks:
  - {id: n1, name: public, "router:external": true, shared: true, tenant_id: admin}
ports:
  - id: p1
    mac_address: "fa:16:3e:00:00:01"
    fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.5}]
    allowed_address_pairs: [{ip_address: 10.0.0.100, mac_address: "00:00:5e:00:01:01"}]
    device_owner: "compute:nova"
    binding:vif_type: ovs
routers:
  - {id: r1, external_gateway_info: null, routes: []}
`, check: func(t *testing.T, inv *Inventory) {
			n := inv.Networks[0]
			if !n.External || !n.Shared || n.Project() != "admin" {
				t.Errorf("network %+v", n)
			}
			p := inv.Ports[0]
			if p.AllowedAddressPairs[0].MACAddress != "00:00:5e:00:01:01" || p.FixedIPs[0].IPAddress != "10.0.0.5" {
				t.Errorf("port %+v", p)
			}
			if inv.Routers[0].GatewayNetworkID() != "" {
				t.Error("null gateway")
			}
		}},
		{name: "JSON as returned by the APIs", in: `{"subnets": [{"id": "s1", "network_id": "n1", "cidr": "10.0.0.0/24", "gateway_ip": null, "ip_version": 4}],
 "amphorae": [{"id": "a1", "loadbalancer_id": "lb1", "compute_id": "c1", "lb_network_ip": "172.31.0.5", "role": "MASTER", "status": "ALLOCATED"}],
 "pools": [{"id": "pl", "members": [{"id": "m1", "address": "10.0.0.7", "protocol_port": 80}]}]}`,
			check: func(t *testing.T, inv *Inventory) {
				if inv.Subnets[0].GatewayIP != "" || inv.Amphorae[0].ComputeID != "c1" || inv.Pools[0].Members[0].ProtocolPort != 80 {
					t.Errorf("%+v", inv)
				}
			}},
		{name: "syntax error", in: "ports: [", wantErr: []string{"inventory t:", "line"}},
		{name: "top level is a list", in: "- a", wantErr: []string{"top level must be a mapping"}},
		{name: "unknown collection", in: "port: []", wantErr: []string{`unknown collection "port"`}},
		{name: "collection is not a list", in: "ports: {id: x}", wantErr: []string{"ports: line 1: must be a list"}},
		{name: "wrong type names object and field", in: "ports:\n  - id: p1\n  - id: p2\n    fixed_ips: 7\n", wantErr: []string{"ports[1] (id p2): fixed_ips:", "line 4"}},
		{name: "wrong type in a nested field", in: "routers:\n  - id: r1\n    routes: [{destination: [1]}]\n", wantErr: []string{"routers[0] (id r1): routes:"}},
		{name: "missing id", in: "networks:\n  - {name: x}\n", wantErr: []string{"networks[0]: line 2: id: missing"}},
		{name: "duplicate id", in: "servers:\n  - {id: s}\n  - {id: s}\n", wantErr: []string{"servers[1] (id s): line 3: id: duplicate of servers[0]"}},
		{name: "member without id", in: "pools:\n  - {id: p, members: [{address: 1.2.3.4}]}\n", wantErr: []string{"pools[0] (id p): members[0]: id: missing"}},
		{name: "trunks (Neutron /v2.0/trunks)", in: `{"trunks": [{"id": "t1", "port_id": "parent", "sub_ports": [{"segmentation_type": "vlan", "segmentation_id": 100, "port_id": "sp"}, {"segmentation_type": "inherit", "segmentation_id": 0, "port_id": "sp2"}]}]}`,
			check: func(t *testing.T, inv *Inventory) {
				if len(inv.Trunks) != 1 || inv.Trunks[0].PortID != "parent" || inv.Trunks[0].SubPorts[0].SegmentationID != 100 || inv.Trunks[0].SubPorts[1].SegmentationType != "inherit" {
					t.Errorf("%+v", inv.Trunks)
				}
			}},
		{name: "trunk without parent, bad VLANs", in: "trunks:\n  - {id: t1, sub_ports: [{port_id: a, segmentation_id: 5000}, {port_id: b, segmentation_id: 7}, {port_id: c, segmentation_id: 7}, {segmentation_id: 8}, {port_id: d, segmentation_type: gre, segmentation_id: 9}]}\n",
			wantErr: []string{"trunks[0] (id t1): port_id: missing", "sub_ports[0] (port a): segmentation_id 5000: use a VLAN id 1–4094", "sub_ports[2] (port c): segmentation_id 7: used twice", "sub_ports[3]: port_id: missing", `sub_ports[4] (port d): segmentation_type "gre": use vlan`}},
		{name: "every error is reported", in: "networks:\n  - {name: x}\nsubnets:\n  - {name: y}\n", wantErr: []string{"networks[0]", "subnets[0]"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv, err := Parse([]byte(c.in), "t")
			if len(c.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if c.check != nil {
					c.check(t, inv)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", c.wantErr)
			}
			for _, w := range c.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestFilePoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	write := func(s string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	f, err := NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Poll(); err == nil || !strings.Contains(err.Error(), "load inventory") {
		t.Fatalf("missing file: %v", err)
	}
	steps := []struct {
		name     string
		content  string // "" keeps the file
		changed  bool
		wantErr  string
		projects int
	}{
		{"first load", "projects: [{id: a}]", true, "", 1},
		{"same content", "", false, "", 0},
		{"new content", "projects: [{id: a}, {id: b}]", true, "", 2},
		{"bad content is reported", "projects: [{name: x}]", false, "id: missing", 0},
		{"bad content is reported once", "", false, "", 0},
		{"fixed content loads", "projects: [{id: c}]", true, "", 1},
	}
	for _, s := range steps {
		if s.content != "" {
			write(s.content)
		}
		inv, changed, err := f.Poll()
		if changed != s.changed || (err == nil) != (s.wantErr == "") || (err != nil && !strings.Contains(err.Error(), s.wantErr)) {
			t.Fatalf("%s: changed %v err %v", s.name, changed, err)
		}
		if changed && len(inv.Projects) != s.projects {
			t.Fatalf("%s: %d projects", s.name, len(inv.Projects))
		}
	}
	if _, err := NewFile(""); err == nil {
		t.Error("empty path accepted")
	}
}
