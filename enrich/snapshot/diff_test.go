package snapshot

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/schemas"
)

const diffHead = `
networks:
  - {id: n1, project_id: t1}
  - {id: n2, project_id: t2}
  - {id: pub, name: public, "router:external": true}
  - {id: pub2, name: public2, "router:external": true}
subnets:
  - {id: s1, network_id: n1, cidr: 10.0.0.0/24, gateway_ip: 10.0.0.1}
  - {id: s2, network_id: n2, cidr: 10.1.0.0/24, gateway_ip: 10.1.0.1}
`

const (
	diffRouter  = "routers:\n  - {id: r1, project_id: t1, external_gateway_info: {network_id: pub}}\n"
	diffRouter2 = "routers:\n  - {id: r1, project_id: t1, external_gateway_info: {network_id: pub2}}\n"
	diffPorts   = `ports:
  - {id: r1-if, network_id: n1, mac_address: "fa:16:3e:00:00:01", device_owner: "network:router_interface", device_id: r1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.1}]}
  - {id: a2, network_id: n1, project_id: t1, mac_address: "fa:16:3e:00:00:20", device_owner: "compute:nova", device_id: vm-a2, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.20}]}
`
	diffA1   = "  - {id: a1, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:00:00:10\", device_owner: \"compute:nova\", device_id: vm-a1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.10}]}\n"
	diffA1v2 = "  - {id: a1, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:00:00:10\", device_owner: \"compute:nova\", device_id: vm-other, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.10}]}\n"
	diffB1   = "  - {id: b1, network_id: n2, project_id: t2, mac_address: \"fa:16:3e:00:00:10\", device_owner: \"compute:nova\", device_id: vm-b1, fixed_ips: [{subnet_id: s2, ip_address: 10.1.0.10}]}\n"
	diffA3   = "  - {id: a3, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:00:00:30\", device_owner: \"compute:nova\", device_id: vm-a3, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.30}]}\n"
	diffDHCP = "  - {id: dhcp, network_id: n1, mac_address: \"fa:16:3e:00:00:99\", device_owner: \"network:dhcp\", device_id: dhcp1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.2}]}\n"
	diffBase = diffHead + diffRouter + diffPorts + diffA1
)

// TestChanged: which inventory changes the swap barrier must act on. A
// change is any record prev and next attribute differently; a pure
// addition (a new VM, a new tenant's VM on another MAC) or a port becoming
// a ghost is none. Each "changed" case is checked against the attribution
// itself: some record really is attributed differently.
func TestChanged(t *testing.T) {
	subnet3 := strings.Replace(diffHead, "subnets:\n", "subnets:\n  - {id: s3, network_id: n2, cidr: 10.2.0.0/24}\n", 1)
	cases := []struct {
		name    string
		next    string
		changed string // substrings of the reason, any of them ("|"; map order picks the first found); "" = no change
		probe   *Input // a record attributed differently (changed cases)
	}{
		{"same inventory", diffBase, "", nil},
		{"new VM", diffBase + diffA3, "", nil},
		{"port removed: a ghost", diffHead + diffRouter + diffPorts, "", nil},
		{"MAC reused by another project", diffHead + diffRouter + diffPorts + diffB1, "MAC fa:16:3e:00:00:10: project changed",
			&Input{Dir: schemas.DirTX, VMMAC: mac(t, "fa:16:3e:00:00:10"), PeerMAC: mac(t, "fa:16:3e:00:00:20")}},
		{"port's server changed", diffHead + diffRouter + diffPorts + diffA1v2, "port changed",
			&Input{Dir: schemas.DirTX, VMMAC: mac(t, "fa:16:3e:00:00:10"), PeerMAC: mac(t, "fa:16:3e:00:00:20")}},
		{"gateway moved", diffHead + diffRouter2 + diffPorts + diffA1, "exit label changed|fallback exit network changed",
			&Input{Dir: schemas.DirTX, VMMAC: mac(t, "fa:16:3e:00:00:10"), PeerMAC: mac(t, "fa:16:3e:00:00:01"), RemoteIP: addr(t, "8.8.8.8")}},
		{"new infra address (DHCP port)", diffBase + diffDHCP, "prefix rows",
			&Input{Dir: schemas.DirTX, VMMAC: mac(t, "fa:16:3e:00:00:10"), RemoteIP: addr(t, "10.0.0.2")}},
		// conservative: any prefix-table difference is a change (the new
		// rows shadow the catch-all external for their addresses)
		{"new subnet of another project", subnet3 + diffRouter + diffPorts + diffA1, "prefix rows of project t2", nil},
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := Build(parseInv(t, diffBase), Options{Version: 1, Now: now, GhostGrace: time.Minute})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			later := now.Add(time.Second)
			next := Build(parseInv(t, c.next), Options{Version: 2, Now: later, GhostGrace: time.Minute, Prev: prev})
			got := next.Changed(prev, later.UnixMicro())
			match := c.changed == ""
			for _, w := range strings.Split(c.changed, "|") {
				match = match || (w != "" && strings.Contains(got, w))
			}
			if (got == "") != (c.changed == "") || !match {
				t.Fatalf("Changed = %q, want %q", got, c.changed)
			}
			if c.probe != nil {
				in := *c.probe
				in.NowUS = later.UnixMicro()
				var a, b Result
				prev.Attribute(&in, &a)
				next.Attribute(&in, &b)
				a.Version, b.Version = 0, 0
				if a == b {
					t.Errorf("probe attributed alike by both: %+v", a)
				}
			}
			// The ghost expiring later changes nothing either: prev no
			// longer attributes it at that time.
			if c.name == "port removed: a ghost" {
				gone := later.Add(2 * time.Minute)
				after := Build(parseInv(t, c.next), Options{Version: 3, Now: gone, GhostGrace: time.Minute, Prev: next})
				if why := after.Changed(next, gone.UnixMicro()); why != "" {
					t.Errorf("ghost expiry: Changed = %q", why)
				}
			}
		})
	}
}

func mac(t *testing.T, s string) uint64 {
	t.Helper()
	m, ok := ParseMAC(s)
	if !ok {
		t.Fatalf("bad MAC %q", s)
	}
	return m
}

func addr(t *testing.T, s string) netip.Addr {
	t.Helper()
	return netip.MustParseAddr(s)
}
