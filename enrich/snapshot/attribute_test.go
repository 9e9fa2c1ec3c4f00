package snapshot

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// MACs of testdata/cloud.yaml.
const (
	macR1T1      = "fa:16:3e:00:00:01"
	macR1Back    = "fa:16:3e:00:00:02"
	macR1T1c     = "fa:16:3e:00:00:03"
	macR2T2      = "fa:16:3e:00:00:11"
	macR3T2      = "fa:16:3e:00:00:31"
	macR4T3      = "fa:16:3e:00:00:41"
	macR4T2      = "fa:16:3e:00:00:42"
	macT3A       = "fa:16:3e:e3:00:01"
	macT2R       = "fa:16:3e:e3:00:02"
	macDHCP      = "fa:16:3e:00:00:21"
	macA1        = "fa:16:3e:a1:00:01"
	macA2        = "fa:16:3e:a1:00:02"
	macA3        = "fa:16:3e:a1:00:03"
	macC1        = "fa:16:3e:c1:00:01"
	macC2        = "fa:16:3e:c2:00:01"
	macB1        = "fa:16:3e:b1:00:01"
	macVRRP      = "00:00:5e:00:01:01"
	macM1        = "fa:16:3e:d1:00:11"
	macM2        = "fa:16:3e:d1:00:12"
	macM3        = "fa:16:3e:d1:00:10"
	macAmp1Mgmt  = "fa:16:3e:aa:01:00"
	macAmp1VRRP  = "fa:16:3e:aa:01:01"
	macAmp1Back  = "fa:16:3e:aa:01:02"
	macAmp2VRRP  = "fa:16:3e:aa:02:01"
	macAmp2Back  = "fa:16:3e:aa:02:02"
	macOldAmp    = "fa:16:3e:aa:09:01"
	macOVNDHCP   = "fa:16:3e:ff:ff:01" // OVN's synthesized DHCP server MAC: not a Neutron port
	macUnknownVM = "fa:16:3e:99:99:99"
)

func loadCloud(t testing.TB) *inventory.Inventory {
	t.Helper()
	inv, err := inventory.Load("testdata/cloud.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func mustMAC(t testing.TB, s string) uint64 {
	t.Helper()
	m, ok := ParseMAC(s)
	if !ok {
		t.Fatalf("bad MAC %q", s)
	}
	return m
}

// in builds an Input from the VM's point of view (already swapped).
func in(t testing.TB, dir schemas.Direction, vm, peer, local, remote string) Input {
	t.Helper()
	x := Input{Dir: dir, VMMAC: mustMAC(t, vm), PeerMAC: mustMAC(t, peer), NowUS: time.Now().UnixMicro()}
	if local != "" {
		x.LocalIP = netip.MustParseAddr(local)
	}
	if remote != "" {
		x.RemoteIP = netip.MustParseAddr(remote)
	}
	return x
}

func withTap(x Input, tap string) Input { x.Tap = tap; return x }

func withPorts(x Input, local, remote uint16) Input {
	x.LocalPort, x.RemotePort = local, remote
	return x
}

type want struct {
	tenant, server, port, zone, peer, ext, lb string
	seg                                       int32
	pool, member                              string
	lbtap                                     string // lb_tap: amphora, member or ''
}

func check(t *testing.T, got Result, w want) {
	t.Helper()
	if w.ext == "" {
		w.ext = schemas.NoExternalNetwork
	}
	g := want{got.TenantID, got.ServerID, got.PortID, got.Zone.String(), got.PeerTenantID, got.ExternalNetwork, got.LBID, got.LBSegment, got.PoolID, got.MemberID, got.LBTap}
	// server and port are only checked when the case names them
	if w.server == "" {
		g.server = ""
	}
	if w.port == "" {
		g.port = ""
	}
	if g != w {
		t.Errorf("got  %+v\nwant %+v", g, w)
	}
}

func TestAttributeRules(t *testing.T) {
	s := Build(loadCloud(t), Options{Version: 7})
	tx, rx := schemas.DirTX, schemas.DirRX
	cases := []struct {
		name string
		in   Input
		want want
	}{
		// §1.3/§1.4 routed internet traffic and the exit label (§1.11 rule 1)
		{"tx to internet via router", in(t, tx, macA1, macR1T1c, "10.0.3.10", "8.8.8.8"), want{tenant: "t1", server: "srv-a1", port: "p-a1", zone: "external", ext: "public"}},
		{"rx from internet through FIP", in(t, rx, macA1, macR1T1c, "10.0.3.10", "8.8.8.8"), want{tenant: "t1", zone: "external", ext: "public"}},
		// §1.5 MAC first
		{"L2 same tenant", in(t, tx, macA1, macA2, "10.0.3.10", "10.0.3.11"), want{tenant: "t1", zone: "same_tenant", peer: "t1"}},
		{"L2 other tenant on shared network", in(t, tx, macC1, macC2, "10.0.1.20", "10.0.1.30"), want{tenant: "t1", zone: "other_tenant", peer: "t2"}},
		{"L2 other tenant, receiving side", in(t, rx, macC2, macC1, "10.0.1.30", "10.0.1.20"), want{tenant: "t2", zone: "other_tenant", peer: "t1"}},
		{"MAC-first beats prefix (in-guest route to an adjacent VM)", in(t, tx, macA1, macA2, "10.0.3.10", "8.8.8.8"), want{tenant: "t1", zone: "same_tenant", peer: "t1"}},
		{"router MAC is not an endpoint: routed same tenant via trie", in(t, tx, macA1, macR1T1c, "10.0.3.10", "10.0.2.20"), want{tenant: "t1", zone: "same_tenant", peer: "t1"}},
		{"router MAC as VM MAC is unknown", in(t, rx, macR1T1c, macA1, "10.0.3.1", "10.0.3.10"), want{tenant: "unknown", zone: "miss"}},
		// §1.9 shared, §1.7 infra
		{"routed to a shared network", in(t, tx, macA1, macR1T1c, "10.0.3.10", "172.16.0.50"), want{tenant: "t1", zone: "shared"}},
		{"VM on a tenant-owned shared network is shared when routed", in(t, tx, macA1, macR1T1c, "10.0.3.10", "10.0.1.20"), want{tenant: "t1", zone: "shared"}},
		{"router interface on shared transit: infra /32 beats shared /24", in(t, tx, macA1, macR1T1c, "10.0.3.10", "172.16.0.1"), want{tenant: "t1", zone: "infra"}},
		{"metadata 169.254.169.254", in(t, tx, macA1, macR1T1c, "10.0.3.10", "169.254.169.254"), want{tenant: "t1", zone: "infra"}},
		{"DHCP reply from the OVN server MAC: gateway is infra", in(t, rx, macA1, macOVNDHCP, "10.0.3.10", "10.0.3.1"), want{tenant: "t1", zone: "infra"}},
		{"DHCP port in own subnet is infra, not same_tenant", in(t, rx, macA1, macDHCP, "10.0.3.10", "10.0.3.2"), want{tenant: "t1", zone: "infra"}},
		{"router gateway SNAT address is infra", in(t, tx, macA1, macR1T1c, "10.0.3.10", "203.0.113.10"), want{tenant: "t1", zone: "infra"}},
		{"external subnet never produces rows: other FIP is external", in(t, tx, macA1, macR1T1c, "10.0.3.10", "203.0.113.77"), want{tenant: "t1", zone: "external", ext: "public"}},
		// §1.8 extraroutes
		{"extraroute through another tenant's router", in(t, tx, macA1, macR1T1c, "10.0.3.10", "10.50.0.10"), want{tenant: "t1", zone: "other_tenant", peer: "t2"}},
		{"extraroute through an appliance VM", in(t, tx, macA1, macR1T1c, "10.0.3.10", "192.168.100.5"), want{tenant: "t1", zone: "same_tenant", peer: "t1"}},
		{"dangling extraroute is external", in(t, tx, macA1, macR1T1c, "10.0.3.10", "10.99.1.1"), want{tenant: "t1", zone: "external", ext: "public"}},
		{"same CIDR is same_tenant from the owner's view", in(t, tx, macB1, macR2T2, "10.50.0.10", "10.50.3.3"), want{tenant: "t2", zone: "same_tenant", peer: "t2"}},
		// cross-tenant through routers (issue 14 item 1): r4 (t2's, no
		// gateway) joins t2's network and t3's, which t3 shares to t2 by
		// RBAC; never external, whatever the path
		{"router joins two projects: t2 VM to t3 VM", in(t, tx, macB1, macR4T2, "10.50.0.10", "10.60.0.10"), want{tenant: "t2", zone: "other_tenant", peer: "t3"}},
		{"router joins two projects: t3 VM receives from t2 VM", in(t, rx, macT3A, macR4T3, "10.60.0.10", "10.50.0.10"), want{tenant: "t3", zone: "other_tenant", peer: "t2"}},
		{"router joins two projects: t3 VM to t2 VM", in(t, tx, macT3A, macR4T3, "10.60.0.10", "10.50.0.10"), want{tenant: "t3", zone: "other_tenant", peer: "t2"}},
		{"RBAC: t2 port on t3's network routed to t2's own subnet", in(t, tx, macT2R, macR4T3, "10.60.0.20", "10.50.0.10"), want{tenant: "t2", zone: "same_tenant", peer: "t2"}},
		{"RBAC: t2's address on t3's network is t2's, not t3's", in(t, rx, macB1, macR4T2, "10.50.0.10", "10.60.0.20"), want{tenant: "t2", zone: "same_tenant", peer: "t2"}},
		{"RBAC: same L2, unknown peer MAC, t3's address", in(t, tx, macT2R, macOVNDHCP, "10.60.0.20", "10.60.0.10"), want{tenant: "t2", zone: "other_tenant", peer: "t3"}},
		{"RBAC: the owner sees t2's port on its network as other_tenant", in(t, tx, macT3A, macOVNDHCP, "10.60.0.10", "10.60.0.20"), want{tenant: "t3", zone: "other_tenant", peer: "t2"}},
		{"extraroute of the joining router into another project's appliance", in(t, tx, macB1, macR4T2, "10.50.0.10", "10.70.0.5"), want{tenant: "t2", zone: "other_tenant", peer: "t3"}},
		{"extraroute of another project's router, seen by t3", in(t, rx, macT3A, macR4T3, "10.60.0.10", "10.70.0.5"), want{tenant: "t3", zone: "same_tenant", peer: "t3"}},
		{"the joining router's address on the other project's subnet is infra", in(t, tx, macB1, macR4T2, "10.50.0.10", "10.60.0.254"), want{tenant: "t2", zone: "infra"}},
		{"outside every joined network is still external", in(t, tx, macT3A, macR4T3, "10.60.0.10", "8.8.8.8"), want{tenant: "t3", zone: "external"}},
		// §1.10 FIP hairpin: external on both taps
		{"FIP hairpin, sender", in(t, tx, macA1, macR1T1c, "10.0.3.10", "203.0.113.51"), want{tenant: "t1", zone: "external", ext: "public"}},
		{"FIP hairpin, receiver", in(t, rx, macA2, macR1T1c, "10.0.3.11", "203.0.113.50"), want{tenant: "t1", zone: "external", ext: "public"}},
		// §1.11 ladder: router MAC, FIP, gateway rule, two exits
		{"exit by router MAC r2", in(t, tx, macB1, macR2T2, "10.50.0.10", "8.8.8.8"), want{tenant: "t2", zone: "external", ext: "public2"}},
		{"exit by router MAC r3 (second external path)", in(t, tx, macB1, macR3T2, "10.50.0.10", "8.8.8.8"), want{tenant: "t2", zone: "external", ext: "public"}},
		{"exit fallback: router holding the subnet gateway", in(t, tx, macB1, macOVNDHCP, "10.50.0.10", "8.8.8.8"), want{tenant: "t2", zone: "external", ext: "public2"}},
		{"exit fallback: floating IP network", in(t, tx, macA1, macOVNDHCP, "10.0.3.10", "8.8.8.8"), want{tenant: "t1", zone: "external", ext: "public"}},
		{"no exit label outside external", in(t, tx, macB1, macR2T2, "10.50.0.10", "10.50.0.99"), want{tenant: "t2", zone: "same_tenant", peer: "t2"}},
		// §1.12 multicast first
		{"multicast sent", in(t, tx, macA1, "01:00:5e:00:00:fb", "10.0.3.10", "224.0.0.251"), want{tenant: "t1", zone: "multicast"}},
		{"broadcast sent (DHCP discover)", in(t, tx, macA1, "ff:ff:ff:ff:ff:ff", "0.0.0.0", "255.255.255.255"), want{tenant: "t1", zone: "multicast"}},
		{"multicast received: group MAC is the VM side", in(t, rx, "33:33:00:00:00:fb", macA3, "ff02::fb", "fd00:2::20"), want{tenant: "unknown", zone: "multicast"}},
		{"multicast received on a known tap: the tap's port", withTap(in(t, rx, "33:33:00:00:00:fb", macA3, "ff02::fb", "fd00:2::20"), "tapp-a3"), want{tenant: "t1", server: "srv-a3", port: "p-a3", zone: "multicast"}},
		{"broadcast received on a known tap", withTap(in(t, rx, "ff:ff:ff:ff:ff:ff", macR1T1c, "255.255.255.255", "10.0.3.1"), "tapp-a1"), want{tenant: "t1", server: "srv-a1", port: "p-a1", zone: "multicast"}},
		{"multicast received on an unknown tap stays unknown", withTap(in(t, rx, "33:33:00:00:00:fb", macA3, "ff02::fb", "fd00:2::20"), "tapffffffff-ff"), want{tenant: "unknown", zone: "multicast"}},
		{"the tap never overrides a unicast VM MAC", withTap(in(t, tx, macA1, macR1T1c, "10.0.3.10", "8.8.8.8"), "tapp-a3"), want{tenant: "t1", server: "srv-a1", port: "p-a1", zone: "external", ext: "public"}},
		{"multicast beats a known peer", in(t, tx, macA1, "01:00:5e:00:00:01", "10.0.3.10", "10.0.3.11"), want{tenant: "t1", zone: "multicast"}},
		// unknown VM
		{"unknown VM MAC", in(t, tx, macUnknownVM, macR1T1c, "10.0.3.77", "8.8.8.8"), want{tenant: "unknown", zone: "miss"}},
		// AAP MACs
		{"allowed-address-pair MAC attributes to the owning port", in(t, tx, macVRRP, macR2T2, "10.50.0.100", "8.8.8.8"), want{tenant: "t2", server: "srv-v1", port: "p-v1", zone: "external", ext: "public2"}},
		// §1.13 IPv6 like IPv4
		{"IPv6 to internet", in(t, tx, macA3, macR1Back, "fd00:2::20", "2001:4860::8888"), want{tenant: "t1", zone: "external", ext: "public"}},
		{"IPv6 gateway is infra", in(t, rx, macA3, macR1Back, "fd00:2::20", "fd00:2::1"), want{tenant: "t1", zone: "infra"}},
		{"IPv6 own subnet routed", in(t, tx, macA3, macOVNDHCP, "fd00:2::20", "fd00:2::99"), want{tenant: "t1", zone: "same_tenant", peer: "t1"}},
		{"IPv6 metadata", in(t, tx, macA3, macOVNDHCP, "fd00:2::20", "fe80::a9fe:a9fe"), want{tenant: "t1", zone: "infra"}},
		{"IPv6 link-local (neighbour discovery with the router) is infra, not external", in(t, tx, macA3, macR1Back, "fe80::f816:3eff:fe00:3", "fe80::f816:3eff:fe00:1"), want{tenant: "t1", zone: "infra"}},
		{"IPv4 link-local is infra", in(t, tx, macA1, macR1T1c, "10.0.3.10", "169.254.7.7"), want{tenant: "t1", zone: "infra"}},
		{"IPv4-mapped IPv6 is IPv4", in(t, tx, macA1, macR1T1c, "::ffff:10.0.3.10", "::ffff:172.16.0.50"), want{tenant: "t1", zone: "shared"}},
		// invalid input
		{"no direction is miss", Input{VMMAC: mustMAC(t, macA1), PeerMAC: mustMAC(t, macR1T1c)}, want{tenant: "t1", zone: "miss"}},
		{"no remote IP on the trie path is miss", in(t, tx, macA1, macR1T1c, "", ""), want{tenant: "t1", zone: "miss"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Result
			s.Attribute(&c.in, &r)
			check(t, r, c.want)
			if r.Version != 7 {
				t.Errorf("version %d, want 7", r.Version)
			}
		})
	}
}

// TestOctavia reproduces the seed's acceptance table (domain reference
// §2.7) record by record: ACTIVE_STANDBY, three members across two subnets
// (m3 reached through a port with no Octavia marker, found only by the
// compute_id join), same-tenant, cross-tenant and floating-IP clients.
func TestOctavia(t *testing.T) {
	s := Build(loadCloud(t), Options{Version: 1})
	tx, rx := schemas.DirTX, schemas.DirRX
	const vip = "10.0.1.100"
	cases := []struct {
		name string
		in   Input
		want want
	}{
		// segment 1, T1 client: T1 same_tenant tx and rx at both taps
		{"T1 client tx to VIP", in(t, tx, macC1, macAmp1VRRP, "10.0.1.20", vip), want{tenant: "t1", zone: "same_tenant", peer: "t1", seg: 1}},
		{"T1 client rx from VIP", in(t, rx, macC1, macAmp1VRRP, "10.0.1.20", vip), want{tenant: "t1", zone: "same_tenant", peer: "t1", seg: 1}},
		{"amphora rx from T1 client bills T1, not the service project", in(t, rx, macAmp1VRRP, macC1, vip, "10.0.1.20"), want{tenant: "t1", server: "nova-amp1", port: "p-amp1-vrrp", zone: "same_tenant", peer: "t1", lb: "lb1", seg: 1, lbtap: "amphora"}},
		{"amphora tx to T1 client", in(t, tx, macAmp1VRRP, macC1, vip, "10.0.1.20"), want{tenant: "t1", zone: "same_tenant", peer: "t1", lb: "lb1", seg: 1, lbtap: "amphora"}},
		// segment 1, T2 client: T2 other_tenant tx; T1 other_tenant rx
		{"T2 client tx to VIP pays its side", in(t, tx, macC2, macAmp1VRRP, "10.0.1.30", vip), want{tenant: "t2", zone: "other_tenant", peer: "t1", seg: 1}},
		{"amphora rx from T2 client is other_tenant for the LB owner", in(t, rx, macAmp1VRRP, macC2, vip, "10.0.1.30"), want{tenant: "t1", zone: "other_tenant", peer: "t2", lb: "lb1", seg: 1, lbtap: "amphora"}},
		// segment 1, floating-IP client: T1 external tx and rx
		{"amphora rx from FIP client", in(t, rx, macAmp1VRRP, macR1T1, vip, "198.18.0.5"), want{tenant: "t1", zone: "external", ext: "public", lb: "lb1", seg: 1, lbtap: "amphora"}},
		{"amphora tx to FIP client", in(t, tx, macAmp1VRRP, macR1T1, vip, "198.18.0.5"), want{tenant: "t1", zone: "external", ext: "public", lb: "lb1", seg: 1, lbtap: "amphora"}},
		{"amphora exit fallback uses the VIP port's FIP", in(t, tx, macAmp1VRRP, macOVNDHCP, vip, "198.18.0.5"), want{tenant: "t1", zone: "external", ext: "public", lb: "lb1", seg: 1, lbtap: "amphora"}},
		// segment 2: infra at the amphora tap (LB owner) and at the member
		// tap (member's own project); both name the pool member, the
		// member's side the LB too (issue 14 item 2)
		{"amphora tx to member m1", withPorts(in(t, tx, macAmp1VRRP, macM1, "10.0.1.101", "10.0.1.11"), 40000, 80), want{tenant: "t1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool1", member: "mem1", lbtap: "amphora"}},
		{"member m1 rx from amphora", withPorts(in(t, rx, macM1, macAmp1VRRP, "10.0.1.11", "10.0.1.101"), 80, 40000), want{tenant: "t1", server: "srv-m1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool1", member: "mem1", lbtap: "member"}},
		{"member m1 of a second pool: the port tells them apart", withPorts(in(t, rx, macM1, macAmp1VRRP, "10.0.1.11", "10.0.1.101"), 8443, 40001), want{tenant: "t1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool2", member: "mem1-tls", lbtap: "member"}},
		{"amphora to m1 on the second pool's port", withPorts(in(t, tx, macAmp1VRRP, macM1, "10.0.1.101", "10.0.1.11"), 40001, 8443), want{tenant: "t1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool2", member: "mem1-tls", lbtap: "amphora"}},
		{"m1 in two pools and no port: no member named", in(t, rx, macM1, macAmp1VRRP, "10.0.1.11", "10.0.1.101"), want{tenant: "t1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, lbtap: "member"}},
		{"member m2 of another tenant keeps its own tenant", in(t, rx, macM2, macAmp1VRRP, "10.0.1.12", "10.0.1.101"), want{tenant: "t2", server: "srv-m2", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool1", member: "mem2", lbtap: "member"}},
		{"amphora rx from member m2", in(t, rx, macAmp1VRRP, macM2, "10.0.1.101", "10.0.1.12"), want{tenant: "t1", zone: "infra", peer: "t2", lb: "lb1", seg: 2, pool: "pool1", member: "mem2", lbtap: "amphora"}},
		{"cross-subnet member through the unmarked port (compute_id join)", in(t, tx, macAmp1Back, macM3, "10.0.2.101", "10.0.2.10"), want{tenant: "t1", server: "nova-amp1", port: "p-amp1-back", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool1", member: "mem3", lbtap: "amphora"}},
		{"member m3 tx to amphora base", in(t, tx, macM3, macAmp1Back, "10.0.2.10", "10.0.2.101"), want{tenant: "t1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool1", member: "mem3", lbtap: "member"}},
		// ACTIVE_STANDBY: the backup is re-attributed too
		{"backup amphora VIP port", in(t, rx, macAmp2VRRP, macC2, vip, "10.0.1.30"), want{tenant: "t1", server: "nova-amp2", zone: "other_tenant", peer: "t2", lb: "lb1", seg: 1, lbtap: "amphora"}},
		{"backup amphora member port", in(t, tx, macAmp2Back, macM3, "10.0.2.102", "10.0.2.10"), want{tenant: "t1", zone: "infra", peer: "t1", lb: "lb1", seg: 2, pool: "pool1", member: "mem3", lbtap: "amphora"}},
		{"segment 1 names no member", in(t, rx, macAmp1VRRP, macC1, vip, "10.0.1.20"), want{tenant: "t1", zone: "same_tenant", peer: "t1", lb: "lb1", seg: 1, lbtap: "amphora"}},
		// what is not re-attributed
		{"management port stays with the service project", in(t, tx, macAmp1Mgmt, macOVNDHCP, "172.31.0.11", "172.31.0.5"), want{tenant: "svc", port: "p-amp1-mgmt", zone: "same_tenant", peer: "svc"}},
		{"DELETED amphora's port stays with the service project", in(t, tx, macOldAmp, macM1, "10.0.1.109", "10.0.1.11"), want{tenant: "svc", zone: "other_tenant", peer: "t1"}},
		{"a VM talking to a member is plain tenant traffic", in(t, tx, macC1, macM1, "10.0.1.20", "10.0.1.11"), want{tenant: "t1", zone: "same_tenant", peer: "t1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Result
			s.Attribute(&c.in, &r)
			check(t, r, c.want)
		})
	}
}

// TestAttributeFlowSwap pins the directional swap over textual records:
// without it, the rx half of an internet download would look up the VM's
// own address and read same_tenant (§1.4).
func TestAttributeFlowSwap(t *testing.T) {
	s := Build(loadCloud(t), Options{Version: 3})
	cases := []struct {
		name         string
		f            schemas.Flow
		zone, tenant string
		wantErr      error
	}{
		{"tx uses dst as remote", schemas.Flow{Direction: "tx", VMMAC: macA1, PeerMAC: macR1T1c, SrcIP: "10.0.3.10", DstIP: "10.50.0.10"}, "other_tenant", "t1", nil},
		{"rx uses src as remote", schemas.Flow{Direction: "rx", VMMAC: macA1, PeerMAC: macR1T1c, SrcIP: "10.50.0.10", DstIP: "10.0.3.10"}, "other_tenant", "t1", nil},
		{"rx download from the internet is external", schemas.Flow{Direction: "rx", VMMAC: macA1, PeerMAC: macR1T1c, SrcIP: "8.8.8.8", DstIP: "10.0.3.10"}, "external", "t1", nil},
		{"rx multicast uses the VM-side MAC as destination", schemas.Flow{Direction: "rx", VMMAC: "01:00:5e:00:00:fb", PeerMAC: macA2, SrcIP: "10.0.3.11", DstIP: "224.0.0.251"}, "multicast", "unknown", nil},
		{"bad direction", schemas.Flow{Direction: "in", VMMAC: macA1, PeerMAC: macR1T1c, SrcIP: "10.0.3.10", DstIP: "8.8.8.8"}, "miss", "t1", ErrBadDirection},
		{"bad MAC", schemas.Flow{Direction: "tx", VMMAC: "nope", PeerMAC: macR1T1c, SrcIP: "10.0.3.10", DstIP: "8.8.8.8"}, "miss", "unknown", ErrBadMAC},
		{"bad IP, MAC path still works", schemas.Flow{Direction: "tx", VMMAC: macA1, PeerMAC: macA2, SrcIP: "x", DstIP: "10.0.3.11"}, "same_tenant", "t1", ErrBadIP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.f
			var r Result
			err := s.AttributeFlow(&f, time.Now().UnixMicro(), &r)
			if err != c.wantErr {
				t.Errorf("err %v, want %v", err, c.wantErr)
			}
			if f.Zone != c.zone || f.TenantID != c.tenant || f.MetadataVersion != 3 {
				t.Errorf("zone %s tenant %s version %d; want %s %s 3", f.Zone, f.TenantID, f.MetadataVersion, c.zone, c.tenant)
			}
		})
	}
}

// TestLBTap: the lb_tap column says which tap saw a record carrying lb_id
// (issue 21 item 8): amphora on every record of the amphora's data ports,
// member on a member's copy of segment 2, ” wherever lb_id is ”. Records
// go through the flow columns (AttributeFlow stamps them), as the agent's
// enrich stage does.
func TestLBTap(t *testing.T) {
	s := Build(loadCloud(t), Options{Version: 5})
	const vip = "10.0.1.100"
	flow := func(dir, vm, peer, src, dst string) schemas.Flow {
		return schemas.Flow{Direction: dir, VMMAC: vm, PeerMAC: peer, SrcIP: src, DstIP: dst, IPVersion: 4, Protocol: 6}
	}
	cases := []struct {
		name string
		f    schemas.Flow
		lb   string
		seg  int32
		tap  string
	}{
		{"amphora rx segment 1 from a client", flow("rx", macAmp1VRRP, macC1, "10.0.1.20", vip), "lb1", 1, schemas.LBTapAmphora},
		{"amphora tx segment 1 to a FIP client", flow("tx", macAmp1VRRP, macR1T1, vip, "198.18.0.5"), "lb1", 1, schemas.LBTapAmphora},
		{"amphora tx segment 2 to a member", flow("tx", macAmp1VRRP, macM1, "10.0.1.101", "10.0.1.11"), "lb1", 2, schemas.LBTapAmphora},
		{"amphora rx segment 2 from a member", flow("rx", macAmp1VRRP, macM2, "10.0.1.12", "10.0.1.101"), "lb1", 2, schemas.LBTapAmphora},
		{"backup amphora segment 2, member port", flow("tx", macAmp2Back, macM3, "10.0.2.102", "10.0.2.10"), "lb1", 2, schemas.LBTapAmphora},
		{"member rx segment 2 from the amphora", flow("rx", macM1, macAmp1VRRP, "10.0.1.101", "10.0.1.11"), "lb1", 2, schemas.LBTapMember},
		{"member tx segment 2 to the amphora", flow("tx", macM2, macAmp1VRRP, "10.0.1.12", "10.0.1.101"), "lb1", 2, schemas.LBTapMember},
		{"member of another subnet tx to the amphora base", flow("tx", macM3, macAmp1Back, "10.0.2.10", "10.0.2.101"), "lb1", 2, schemas.LBTapMember},
		{"client's own tap, segment 1: no lb_id, no lb_tap", flow("tx", macC1, macAmp1VRRP, "10.0.1.20", vip), "", 1, ""},
		{"member talking to a plain VM", flow("tx", macM1, macC1, "10.0.1.11", "10.0.1.20"), "", 0, ""},
		{"management port", flow("tx", macAmp1Mgmt, macOVNDHCP, "172.31.0.11", "172.31.0.5"), "", 0, ""},
		{"unknown VM", flow("tx", macUnknownVM, macA1, "10.9.9.9", "10.0.3.10"), "", 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.f
			f.LBTap = "stale" // stamping overwrites whatever was there
			var r Result
			if err := s.AttributeFlow(&f, time.Now().UnixMicro(), &r); err != nil {
				t.Fatal(err)
			}
			if f.LBID != c.lb || f.LBSegment != c.seg || f.LBTap != c.tap {
				t.Fatalf("lb_id %q lb_segment %d lb_tap %q; want %q %d %q (zone %s tenant %s)", f.LBID, f.LBSegment, f.LBTap, c.lb, c.seg, c.tap, f.Zone, f.TenantID)
			}
			if (f.LBID == "") != (f.LBTap == "") {
				t.Fatalf("lb_id %q with lb_tap %q: one without the other", f.LBID, f.LBTap)
			}
		})
	}
}
