package snapshot

import (
	"testing"

	"github.com/tapflow/tapflow/schemas"
)

// trunkCloud: vm1's port is a trunk parent on n1; subport s100 (VLAN 100)
// on n2 shares the parent's MAC (Neutron's default), s200 (VLAN 200) on n3
// has a MAC of its own; s300 uses inherit segmentation (not attributed by
// VLAN).
const trunkCloud = `
networks:
  - {id: n1, project_id: t1}
  - {id: n2, project_id: t1}
  - {id: n3, project_id: t2}
subnets:
  - {id: s1, network_id: n1, cidr: 10.1.0.0/24, gateway_ip: 10.1.0.1}
  - {id: s2, network_id: n2, cidr: 10.2.0.0/24, gateway_ip: 10.2.0.1}
  - {id: s3, network_id: n3, cidr: 10.3.0.0/24, gateway_ip: 10.3.0.1}
ports:
  - {id: parent, project_id: t1, network_id: n1, mac_address: "fa:16:3e:7a:00:01", device_owner: "compute:nova", device_id: vm1, fixed_ips: [{subnet_id: s1, ip_address: 10.1.0.10}]}
  - {id: s100, project_id: t1, network_id: n2, mac_address: "fa:16:3e:7a:00:01", device_owner: "trunk:subport", device_id: vm1, fixed_ips: [{subnet_id: s2, ip_address: 10.2.0.10}]}
  - {id: s200, project_id: t2, network_id: n3, mac_address: "fa:16:3e:7a:00:02", device_owner: "trunk:subport", device_id: vm1, fixed_ips: [{subnet_id: s3, ip_address: 10.3.0.10}]}
  - {id: s300, project_id: t1, network_id: n2, mac_address: "fa:16:3e:7a:00:01", device_owner: "trunk:subport", device_id: vm1, fixed_ips: [{subnet_id: s2, ip_address: 10.2.0.11}]}
  - {id: b2, project_id: t1, network_id: n2, mac_address: "fa:16:3e:7b:00:02", device_owner: "compute:nova", device_id: vm2, fixed_ips: [{subnet_id: s2, ip_address: 10.2.0.20}]}
trunks:
  - id: tr1
    port_id: parent
    sub_ports:
      - {port_id: s100, segmentation_type: vlan, segmentation_id: 100}
      - {port_id: s200, segmentation_type: vlan, segmentation_id: 200}
      - {port_id: s300, segmentation_type: inherit}
`

func TestTrunkPorts(t *testing.T) {
	s := Build(parseInv(t, trunkCloud), Options{Version: 1})
	const parentMAC, ownMAC, b2 = "fa:16:3e:7a:00:01", "fa:16:3e:7a:00:02", "fa:16:3e:7b:00:02"
	vlan := func(x Input, v uint16) Input { x.VLAN = v; return x }
	cases := []struct {
		name string
		in   Input
		want want
	}{
		{"untagged frames are the parent's", in(t, schemas.DirTX, parentMAC, "fa:16:3e:00:00:99", "10.1.0.10", "10.1.0.50"), want{tenant: "t1", port: "parent", zone: "same_tenant", peer: "t1"}},
		{"VLAN 100: the subport sharing the parent's MAC", vlan(in(t, schemas.DirTX, parentMAC, b2, "10.2.0.10", "10.2.0.20"), 100), want{tenant: "t1", port: "s100", zone: "same_tenant", peer: "t1"}},
		{"VLAN 100 received", vlan(in(t, schemas.DirRX, parentMAC, "fa:16:3e:00:00:99", "10.2.0.10", "8.8.8.8"), 100), want{tenant: "t1", port: "s100", zone: "external"}},
		{"VLAN 200: a subport with a MAC of its own, of another project", vlan(in(t, schemas.DirTX, ownMAC, "fa:16:3e:00:00:99", "10.3.0.10", "10.3.0.77"), 200), want{tenant: "t2", port: "s200", zone: "same_tenant", peer: "t2"}},
		{"a VLAN no subport claims stays with the parent", vlan(in(t, schemas.DirTX, parentMAC, "fa:16:3e:00:00:99", "10.1.0.10", "10.1.0.50"), 300), want{tenant: "t1", port: "parent", zone: "same_tenant", peer: "t1"}},
		{"the peer sees the parent by MAC", in(t, schemas.DirRX, b2, parentMAC, "10.2.0.20", "10.2.0.10"), want{tenant: "t1", port: "p", zone: "same_tenant", peer: "t1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Result
			s.Attribute(&c.in, &r)
			if c.want.port == "p" {
				c.want.port = ""
			}
			check(t, r, c.want)
		})
	}
	for _, a := range s.Anomalies() {
		if a.Class == AnomalyDuplicateMAC {
			t.Errorf("subport sharing the parent's MAC is a duplicate: %v", a)
		}
	}
	if !hasAnomaly(s, AnomalyTrunkSkipped, "tr1") {
		t.Errorf("inherit subport: no %s anomaly in %v", AnomalyTrunkSkipped, s.Anomalies())
	}
}
