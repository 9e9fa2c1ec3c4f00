package snapshot

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

func parseInv(t *testing.T, y string) *inventory.Inventory {
	t.Helper()
	inv, err := inventory.Parse([]byte(y), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// routesCloud: t1's router r1 and the routers it reaches over a shared
// transit network. The extra YAML is appended to r1's routes.
const routesCloud = `
networks:
  - {id: n-transit, project_id: admin, shared: true}
  - {id: n1, project_id: t1}
  - {id: n2, project_id: t2}
  - {id: n3, project_id: t3}
  - {id: n88, project_id: t2}
subnets:
  - {id: s-transit, network_id: n-transit, cidr: 172.16.0.0/24}
  - {id: s1, network_id: n1, cidr: 10.0.1.0/24, gateway_ip: 10.0.1.1}
  - {id: s2-wide, network_id: n2, cidr: 10.0.0.0/8}
  - {id: s3, network_id: n3, cidr: 10.60.0.0/16}
  - {id: s88, network_id: n88, cidr: 10.88.0.0/16}
routers:
  - id: r1
    project_id: t1
    routes:
      - {destination: 10.77.0.0/16, nexthop: 172.16.0.2}   # r2 sends it back: cycle
      - {destination: 10.60.5.0/24, nexthop: 172.16.0.3}   # r3 has two owners covering it: ambiguity
      - {destination: 10.88.0.0/16, nexthop: 172.16.0.2}   # r2 → r4 → n88: two hops
      - {destination: 10.0.1.0/24, nexthop: 172.16.0.2}    # bogus route over an owned subnet: the owned row wins the tie
  - id: r2
    project_id: t2
    routes:
      - {destination: 10.77.0.0/16, nexthop: 172.16.0.1}
      - {destination: 10.88.0.0/16, nexthop: 172.16.0.4}
  - {id: r3, project_id: admin}
  - {id: r4, project_id: t2}
ports:
  - {id: r1-t, mac_address: "fa:16:3e:00:00:01", device_owner: "network:router_interface", device_id: r1, network_id: n-transit, fixed_ips: [{subnet_id: s-transit, ip_address: 172.16.0.1}]}
  - {id: r1-1, mac_address: "fa:16:3e:00:00:02", device_owner: "network:router_interface", device_id: r1, network_id: n1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.1.1}]}
  - {id: r2-t, mac_address: "fa:16:3e:00:00:03", device_owner: "network:router_interface", device_id: r2, network_id: n-transit, fixed_ips: [{subnet_id: s-transit, ip_address: 172.16.0.2}]}
  - {id: r3-t, mac_address: "fa:16:3e:00:00:04", device_owner: "network:router_interface", device_id: r3, network_id: n-transit, fixed_ips: [{subnet_id: s-transit, ip_address: 172.16.0.3}]}
  - {id: r3-2, mac_address: "fa:16:3e:00:00:05", device_owner: "network:router_interface", device_id: r3, network_id: n2, fixed_ips: [{subnet_id: s2-wide, ip_address: 10.0.0.1}]}
  - {id: r3-3, mac_address: "fa:16:3e:00:00:06", device_owner: "network:router_interface", device_id: r3, network_id: n3, fixed_ips: [{subnet_id: s3, ip_address: 10.60.0.1}]}
  - {id: r4-t, mac_address: "fa:16:3e:00:00:07", device_owner: "network:router_interface", device_id: r4, network_id: n-transit, fixed_ips: [{subnet_id: s-transit, ip_address: 172.16.0.4}]}
  - {id: r4-88, mac_address: "fa:16:3e:00:00:08", device_owner: "network:router_interface", device_id: r4, network_id: n88, fixed_ips: [{subnet_id: s88, ip_address: 10.88.0.1}]}
  - {id: vm1, project_id: t1, network_id: n1, mac_address: "fa:16:3e:10:00:01", device_owner: "compute:nova", device_id: srv1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.1.10}]}
`

func hasAnomaly(s *Snapshot, class, id string) bool {
	return slices.ContainsFunc(s.Anomalies(), func(a Anomaly) bool { return a.Class == class && a.ID == id })
}

func TestRouteResolver(t *testing.T) {
	inv := parseInv(t, routesCloud)
	cases := []struct {
		name    string
		hops    int
		remote  string
		zone    string
		peer    string
		anomaly string
	}{
		{"cycle is external", 16, "10.77.1.1", "external", "", AnomalyCycle},
		{"ambiguous owners are external", 16, "10.60.5.9", "external", "", AnomalyAmbiguity},
		{"two hops reach the owner", 16, "10.88.3.3", "other_tenant", "t2", ""},
		{"max hops exceeded is external", 1, "10.88.3.3", "external", "", AnomalyMaxHops},
		{"owned subnet beats a route with the same prefix", 16, "10.0.1.20", "same_tenant", "t1", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := Build(inv, Options{MaxRouteHops: c.hops})
			x := in(t, schemas.DirTX, "fa:16:3e:10:00:01", "fa:16:3e:00:00:02", "10.0.1.10", c.remote)
			var r Result
			s.Attribute(&x, &r)
			if r.Zone.String() != c.zone || r.PeerTenantID != c.peer {
				t.Errorf("zone %s peer %q, want %s %q", r.Zone, r.PeerTenantID, c.zone, c.peer)
			}
			if c.anomaly != "" && !hasAnomaly(s, c.anomaly, "r1") {
				t.Errorf("no %s anomaly for r1 in %v", c.anomaly, s.Anomalies())
			}
		})
	}
}

// without returns a copy of inv without the port with id, plus extra ports.
func without(inv *inventory.Inventory, id string, extra ...inventory.Port) *inventory.Inventory {
	c := *inv
	c.Ports = slices.DeleteFunc(slices.Clone(inv.Ports), func(p inventory.Port) bool { return p.ID == id })
	c.Ports = append(c.Ports, extra...)
	return &c
}

func TestGhostAndMACReuse(t *testing.T) {
	inv := loadCloud(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixMicro() }
	grace := 60 * time.Second
	s1 := Build(inv, Options{Version: 1, Now: t0, GhostGrace: grace})
	// m1 (t1) deleted at +10s
	s2 := Build(without(inv, "p-m1"), Options{Version: 2, Now: t0.Add(10 * time.Second), GhostGrace: grace, Prev: s1})
	// still gone at +40s: the ghost keeps its first deadline (+70s)
	s3 := Build(without(inv, "p-m1"), Options{Version: 3, Now: t0.Add(40 * time.Second), GhostGrace: grace, Prev: s2})
	// the MAC comes back at +50s on a t2 port: no inheritance
	reused := inventory.Port{ID: "p-new", ProjectID: "t2", NetworkID: "net-t1", MACAddress: macM1, DeviceOwner: "compute:nova", DeviceID: "srv-new"}
	s4 := Build(without(inv, "p-m1", reused), Options{Version: 4, Now: t0.Add(50 * time.Second), GhostGrace: grace, Prev: s3})
	// same MAC, port recreated with a new id in the same pass
	recreated := inventory.Port{ID: "p-m1-again", ProjectID: "t1", NetworkID: "net-t1", MACAddress: macM1, DeviceOwner: "compute:nova", DeviceID: "srv-m1"}
	s5 := Build(without(inv, "p-m1", recreated), Options{Version: 5, Now: t0.Add(10 * time.Second), GhostGrace: grace, Prev: s1})
	// no grace: deleted means unknown at once
	s6 := Build(without(inv, "p-m1"), Options{Version: 6, Now: t0.Add(10 * time.Second), Prev: s1})

	cases := []struct {
		name         string
		s            *Snapshot
		now          int64
		vm, peer     string
		tenant, zone string
		port         string
	}{
		{"ghost attributes its own tail", s2, at(30 * time.Second), macM1, macC1, "t1", "same_tenant", "p-m1"},
		{"ghost is a known peer: same_tenant, not shared", s2, at(30 * time.Second), macC1, macM1, "t1", "same_tenant", ""},
		{"ghost keeps its first deadline", s3, at(69 * time.Second), macM1, macC1, "t1", "same_tenant", "p-m1"},
		{"ghost expired", s3, at(71 * time.Second), macM1, macC1, "unknown", "miss", ""},
		{"expired ghost peer falls to the trie", s3, at(71 * time.Second), macC1, macM1, "t1", "shared", ""},
		{"reused MAC never inherits the old owner", s4, at(51 * time.Second), macM1, macC1, "t2", "other_tenant", "p-new"},
		{"recreated port rebinds to the new port id", s5, at(11 * time.Second), macM1, macC1, "t1", "same_tenant", "p-m1-again"},
		{"grace 0 disables ghosts", s6, at(11 * time.Second), macM1, macC1, "unknown", "miss", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := in(t, schemas.DirTX, c.vm, c.peer, "10.0.1.11", "10.0.1.11")
			x.NowUS = c.now
			var r Result
			c.s.Attribute(&x, &r)
			if r.TenantID != c.tenant || r.Zone.String() != c.zone || (c.port != "" && r.PortID != c.port) {
				t.Errorf("got %s/%s/%s, want %s/%s/%s", r.TenantID, r.Zone, r.PortID, c.tenant, c.zone, c.port)
			}
		})
	}
	if g := s2.Stats().Ghosts; g != 1 {
		t.Errorf("s2 ghosts %d, want 1", g)
	}
	s7 := Build(without(inv, "p-m1"), Options{Now: t0.Add(80 * time.Second), GhostGrace: grace, Prev: s3})
	if g := s7.Stats().Ghosts; g != 0 {
		t.Errorf("expired ghost carried: %d", g)
	}
}

func TestBadInventory(t *testing.T) {
	inv := parseInv(t, `
networks:
  - {id: n1, project_id: t1}
  - {id: n2, project_id: t2}
subnets:
  - {id: s-bad, network_id: n1, cidr: 10.0.0.0/33}
  - {id: s-orphan, network_id: n-missing, cidr: 10.9.0.0/24}
  - {id: s1, network_id: n1, cidr: 10.0.1.0/24, gateway_ip: not-an-ip}
  - {id: s2, network_id: n2, cidr: 10.0.2.0/24}
routers:
  - {id: ra, project_id: t1, external_gateway_info: {network_id: ext-a}}
  - {id: rb, project_id: t1, external_gateway_info: {network_id: ext-b}, routes: [{destination: nope, nexthop: 10.0.1.1}, {destination: 10.5.0.0/16, nexthop: bad}]}
ports:
  - {id: p-badmac, project_id: t1, network_id: n1, mac_address: "zz:16:3e:00:00:01", device_owner: "compute:nova"}
  - {id: p-noproj, network_id: n1, mac_address: "fa:16:3e:00:00:02", device_owner: "compute:nova"}
  - {id: p-nonet, project_id: t1, network_id: n-missing, mac_address: "fa:16:3e:00:00:03", device_owner: "compute:nova", device_id: srv3}
  - {id: p-dup-a, project_id: t1, network_id: n1, mac_address: "fa:16:3e:00:00:04", device_owner: "compute:nova", device_id: srv4a}
  - {id: p-dup-b, project_id: t1, network_id: n1, mac_address: "fa:16:3e:00:00:04", device_owner: "compute:nova", device_id: srv4b}
  - {id: p-x-a, project_id: t1, network_id: n1, mac_address: "fa:16:3e:00:00:05", device_owner: "compute:nova"}
  - {id: p-x-b, project_id: t2, network_id: n2, mac_address: "fa:16:3e:00:00:05", device_owner: "compute:nova"}
  - {id: p-badip, project_id: t1, network_id: n1, mac_address: "fa:16:3e:00:00:06", device_owner: "compute:nova", fixed_ips: [{subnet_id: s1, ip_address: 10.0.1.300}]}
  - {id: ra-1, network_id: n1, mac_address: "fa:16:3e:00:00:0a", device_owner: "network:router_interface", device_id: ra, fixed_ips: [{subnet_id: s1, ip_address: 10.0.1.1}]}
  - {id: rb-1, network_id: n1, mac_address: "fa:16:3e:00:00:0a", device_owner: "network:router_interface", device_id: rb, fixed_ips: [{subnet_id: s1, ip_address: 10.0.1.2}]}
  - {id: p-unbound, project_id: t1, network_id: n1, mac_address: "fa:16:3e:00:00:0b", device_owner: ""}
  - {id: p-manila, project_id: t2, network_id: n2, mac_address: "fa:16:3e:00:00:0c", device_owner: "manila:share"}
`)
	s := Build(inv, Options{Version: 1})
	for _, w := range []struct{ class, id string }{
		{AnomalyInvalidCIDR, "s-bad"},
		{AnomalyUnknownNetwork, "s-orphan"},
		{AnomalyInvalidIP, "s1"},
		{AnomalyInvalidMAC, "p-badmac"},
		{AnomalyMissingProject, "p-noproj"},
		{AnomalyUnknownNetwork, "p-nonet"},
		{AnomalyDuplicateMAC, "p-dup-a"},
		{AnomalyDuplicateMAC, "p-x-a"},
		{AnomalyInvalidIP, "p-badip"},
		{AnomalyDuplicateRouterMAC, "rb"},
		{AnomalyInvalidCIDR, "rb"},
		{AnomalyInvalidIP, "rb"},
	} {
		if !hasAnomaly(s, w.class, w.id) {
			t.Errorf("missing anomaly %s for %s", w.class, w.id)
		}
	}
	cases := []struct {
		name, mac, tenant, server, ext string
	}{
		{"port on unknown network is admitted", "fa:16:3e:00:00:03", "t1", "srv3", ""},
		{"duplicate MAC, one tenant: smallest port id keeps it", "fa:16:3e:00:00:04", "t1", "srv4a", ""},
		{"duplicate MAC, two tenants: nobody", "fa:16:3e:00:00:05", "unknown", "", ""},
		{"bad MAC not admitted", "fa:16:3e:00:00:02", "unknown", "", ""},
		{"unbound port not admitted", "fa:16:3e:00:00:0b", "unknown", "", ""},
		{"unknown vendor owner admitted", "fa:16:3e:00:00:0c", "t2", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := in(t, schemas.DirTX, c.mac, "fa:16:3e:00:00:0a", "10.0.1.50", "8.8.8.8")
			var r Result
			s.Attribute(&x, &r)
			if r.TenantID != c.tenant || r.ServerID != c.server {
				t.Errorf("got %s/%s, want %s/%s", r.TenantID, r.ServerID, c.tenant, c.server)
			}
			if r.TenantID != schemas.UnknownTenant && r.ExternalNetwork != schemas.NoExternalNetwork && r.Zone == schemas.ZoneExternal {
				// the shared router MAC of two exits is dropped from the map
				t.Errorf("ext %q: a router MAC claimed by two exits must not label", r.ExternalNetwork)
			}
		})
	}
	if len(s.Anomalies()) == 0 || !strings.Contains(s.Anomalies()[0].String(), " ") {
		t.Error("anomalies must render")
	}
}

// TestLPMMatchesBruteForce checks the flattened tables against a linear
// longest-prefix search over random nested and disjoint prefixes.
func TestLPMMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bits := range []int{32, 128} {
		for round := 0; round < 20; round++ {
			seen := map[netip.Prefix]bool{}
			var rows []row
			for i := 0; i < 60; i++ {
				var a netip.Addr
				if bits == 32 {
					a = netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))})
				} else {
					var b [16]byte
					b[0], b[1], b[7], b[15] = 0xfd, byte(rng.IntN(3)), byte(rng.IntN(256)), byte(rng.IntN(256))
					a = netip.AddrFrom16(b)
				}
				p := netip.PrefixFrom(a, rng.IntN(bits+1)).Masked()
				if seen[p] {
					continue
				}
				seen[p] = true
				rows = append(rows, row{p, int32(len(rows))})
			}
			brute := func(a netip.Addr) int32 {
				best, bl := int32(-1), -1
				for _, r := range rows {
					if r.p.Contains(a) && r.p.Bits() > bl {
						best, bl = r.val, r.p.Bits()
					}
				}
				return best
			}
			orig := slices.Clone(rows)
			t4, t6 := buildLPM4(slices.Clone(rows)), buildLPM6(slices.Clone(rows))
			rows = orig
			for i := 0; i < 2000; i++ {
				var a netip.Addr
				var got int32
				if bits == 32 {
					a = netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))})
					if i%7 == 0 {
						a = rows[rng.IntN(len(rows))].p.Addr()
					}
					k := addrKey(a)
					got = t4.lookup(uint32(k.lo))
				} else {
					var b [16]byte
					b[0], b[1], b[7], b[15] = 0xfd, byte(rng.IntN(3)), byte(rng.IntN(256)), byte(rng.IntN(256))
					a = netip.AddrFrom16(b)
					if i%7 == 0 {
						a = rows[rng.IntN(len(rows))].p.Addr()
					}
					got = t6.lookup(addrKey(a))
				}
				if want := brute(a); got != want {
					t.Fatalf("bits %d round %d: %s → %d, want %d", bits, round, a, got, want)
				}
			}
		}
	}
}
