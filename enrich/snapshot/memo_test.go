package snapshot

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/schemas"
)

// corpusOf draws n records over inv, mixing everything the rules look
// at: the ports' and allowed-address pairs' MACs (as the VM and as the
// peer), group and unknown MACs, the ports', subnets' (gateways, random
// hosts) and floating addresses, internet, link-local, multicast and
// v4-mapped addresses and none, both directions and an invalid one, the
// L4 ports pool members use, trunk VLANs, taps, and clocks spread by
// ±spread around at (ghost deadlines).
func corpusOf(tb testing.TB, inv *inventory.Inventory, n int, seed uint64, at time.Time, spread time.Duration) []Input {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	macs := []uint64{0, mustMAC(tb, "01:00:5e:00:00:fb"), mustMAC(tb, "ff:ff:ff:ff:ff:ff"), mustMAC(tb, "33:33:00:00:00:01"), mustMAC(tb, "fa:16:3e:99:99:99")}
	var addrs []netip.Addr
	var taps []string
	addAddr := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			addrs = append(addrs, a)
		}
	}
	for _, s := range []string{"8.8.8.8", "198.18.0.5", "203.0.113.77", "169.254.169.254", "169.254.7.7", "224.0.0.251", "255.255.255.255", "0.0.0.0",
		"2001:4860::8888", "fe80::1", "fe80::a9fe:a9fe", "ff02::fb", "::ffff:10.0.3.10", "::ffff:172.16.0.50"} {
		addAddr(s)
	}
	addrs = append(addrs, netip.Addr{})
	for i := range inv.Ports {
		p := &inv.Ports[i]
		if m, ok := ParseMAC(p.MACAddress); ok {
			macs = append(macs, m)
		}
		for _, f := range p.FixedIPs {
			addAddr(f.IPAddress)
		}
		for _, a := range p.AllowedAddressPairs {
			addAddr(a.IPAddress)
			if m, ok := ParseMAC(a.MACAddress); ok {
				macs = append(macs, m)
			}
		}
		taps = append(taps, "tap"+p.ID[:min(11, len(p.ID))])
	}
	for i := range inv.Subnets {
		sn := &inv.Subnets[i]
		addAddr(sn.GatewayIP)
		if p, err := netip.ParsePrefix(sn.CIDR); err == nil && p.Addr().Is4() {
			b := p.Masked().Addr().As4()
			host := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
			host += uint32(rng.IntN(1 << min(16, 32-p.Bits())))
			addrs = append(addrs, netip.AddrFrom4([4]byte{byte(host >> 24), byte(host >> 16), byte(host >> 8), byte(host)}))
		} else if err == nil {
			addrs = append(addrs, p.Masked().Addr().Next())
		}
	}
	for i := range inv.FloatingIPs {
		addAddr(inv.FloatingIPs[i].FloatingIPAddress)
	}
	vlans := []uint16{100, 200, 4094}
	for _, tr := range inv.Trunks {
		for _, sp := range tr.SubPorts {
			vlans = append(vlans, uint16(sp.SegmentationID))
		}
	}
	taps = append(taps, "tapffffffff-ff", "eth0")
	l4 := []uint16{0, 80, 443, 8443, 40000, 40001}
	pick := func(n int) int { return rng.IntN(n) }
	out := make([]Input, n)
	for i := range out {
		x := &out[i]
		x.Dir = []schemas.Direction{schemas.DirTX, schemas.DirRX, schemas.DirTX, schemas.DirRX, schemas.DirInvalid}[pick(5)]
		x.VMMAC, x.PeerMAC = macs[pick(len(macs))], macs[pick(len(macs))]
		x.LocalIP, x.RemoteIP = addrs[pick(len(addrs))], addrs[pick(len(addrs))]
		x.LocalPort, x.RemotePort = l4[pick(len(l4))], l4[pick(len(l4))]
		if pick(8) == 0 {
			x.VLAN = vlans[pick(len(vlans))]
		}
		if pick(3) == 0 {
			x.Tap = taps[pick(len(taps))]
		}
		x.NowUS = at.Add(time.Duration(rng.Int64N(int64(2*spread+1))) - spread).UnixMicro()
	}
	return out
}

// dropPorts is inv without every k-th port (k ≥ 2): the ports a later
// snapshot keeps as ghosts.
func dropPorts(inv *inventory.Inventory, k int) *inventory.Inventory {
	c := *inv
	c.Ports = nil
	for i, p := range inv.Ports {
		if i%k != 0 {
			c.Ports = append(c.Ports, p)
		}
	}
	return &c
}

// TestAttributeMemoSame: attribution through a Memo gives exactly the
// Result of Attribute, record by record, over every corpus: the domain
// reference's cloud (rules, Octavia), the same cloud with ghosts around
// their deadline, trunks, the realistic generated cloud with the
// benchmarks' traffic mixes, and a fleet of random records over each.
// One Memo serves all corpora in turn (a new snapshot resets it), and
// each corpus runs twice (the second time from a warm memo).
func TestAttributeMemoSame(t *testing.T) {
	now := time.Now()
	cloud := loadCloud(t)
	full := Build(cloud, Options{Version: 1, Now: now})
	ghosts := Build(dropPorts(cloud, 2), Options{Version: 2, Now: now, GhostGrace: 10 * time.Second, Prev: full})
	if ghosts.Stats().Ghosts == 0 {
		t.Fatal("no ghosts in the ghost corpus")
	}
	trunks := parseInv(t, trunkCloud)
	o := synth.Realistic
	o.WithIPv6 = true
	big := synth.Generate(o)
	realistic := Build(big, Options{Version: 3, Now: now})
	cases := []struct {
		name string
		s    *Snapshot
		ins  []Input
	}{
		{"cloud.yaml", full, corpusOf(t, cloud, 50000, 1, now, time.Second)},
		{"cloud.yaml ghosts at their deadline", ghosts, corpusOf(t, cloud, 50000, 2, now.Add(10*time.Second), 10*time.Second)},
		{"trunks", Build(trunks, Options{Version: 4, Now: now}), corpusOf(t, trunks, 20000, 3, now, time.Second)},
		{"realistic cloud, random records", realistic, corpusOf(t, big, 50000, 4, now, time.Second)},
		{"realistic cloud, node-local mix", realistic, mixedTrafficOver(t, 20000, 4)},
		{"realistic cloud, all-tenants mix", realistic, mixedTraffic(t, 50000)},
	}
	// m as the Engine has it (its gates may turn it off on the random
	// corpora); pinned with its gates held on, so every record of every
	// corpus goes through the memo's tables
	var m, pinned Memo
	pinned.gate[gateMAC].end, pinned.gate[gatePrefix].end = math.MaxInt64, math.MaxInt64
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			diff, zones := 0, map[schemas.Zone]int{}
			for pass := range 2 {
				for i := range c.ins {
					var want, got, gotPinned Result
					x, y, z := c.ins[i], c.ins[i], c.ins[i]
					c.s.Attribute(&x, &want)
					c.s.AttributeMemo(&m, &y, &got)
					c.s.AttributeMemo(&pinned, &z, &gotPinned)
					if got != want || gotPinned != want {
						if diff++; diff <= 5 {
							t.Errorf("pass %d record %d %+v:\nmemo   %+v\npinned %+v\nplain  %+v", pass, i, c.ins[i], got, gotPinned, want)
						}
					}
					zones[want.Zone]++
				}
			}
			if diff > 0 {
				t.Fatalf("%d of %d records differ", diff, 2*len(c.ins))
			}
			// the corpus must reach the rules, not only miss
			for _, z := range []schemas.Zone{schemas.ZoneMiss, schemas.ZoneExternal, schemas.ZoneSameTenant, schemas.ZoneInfra, schemas.ZoneMulticast} {
				if zones[z] == 0 && c.name != "trunks" {
					t.Errorf("no %s record in the corpus: %v", z, zones)
				}
			}
		})
	}
}

// TestMemoGateSwitch: a Memo whose traffic goes from one hypervisor's
// working set (≈40 VMs: the memo pays) to 10,000 VMs in random order
// (it thrashes: the gates turn it off) and back (a probe finds it pays
// again: on) gives exactly Attribute's result on every record, before,
// across and after both switches, and the gates do switch.
func TestMemoGateSwitch(t *testing.T) {
	s := realistic(t)
	phases := []struct {
		name string
		ins  []Input
		// the MAC gate's state at the end of the phase
		macOff bool
	}{
		{"node-local", mixedTrafficOver(t, 20000, 4), false},
		{"all-tenants random", mixedTraffic(t, 50000), true},
		{"node-local again", mixedTrafficOver(t, 40000, 4), false},
	}
	var m Memo
	for _, p := range phases {
		offs, ons := 0, 0 // records with the MAC gate off, on
		for i := range p.ins {
			var want, got Result
			x, y := p.ins[i], p.ins[i]
			s.Attribute(&x, &want)
			s.AttributeMemo(&m, &y, &got)
			if got != want {
				t.Fatalf("%s record %d %+v (gates %+v):\nmemo  %+v\nplain %+v", p.name, i, p.ins[i], m.gate, got, want)
			}
			if m.gate[gateMAC].off {
				offs++
			} else {
				ons++
			}
		}
		t.Logf("%s: MAC gate off for %d records, on for %d; gates at the end %+v", p.name, offs, ons, m.gate)
		if m.gate[gateMAC].off != p.macOff {
			t.Errorf("%s: MAC gate off %v at the end, want %v (gates %+v)", p.name, m.gate[gateMAC].off, p.macOff, m.gate)
		}
		if p.macOff && ons > len(p.ins)/4 {
			t.Errorf("%s: the thrashing memo stayed on for %d of %d records", p.name, ons, len(p.ins))
		}
	}
}

// TestMemoSnapshotSwitch: a Memo used with one snapshot and then another
// answers from the new one (an Engine swaps snapshots between batches).
func TestMemoSnapshotSwitch(t *testing.T) {
	cloud := loadCloud(t)
	a := Build(cloud, Options{Version: 1})
	b := Build(dropPorts(cloud, 2), Options{Version: 2}) // no ghosts: the dropped ports are unknown
	ins := corpusOf(t, cloud, 5000, 9, time.Now(), 0)
	var m Memo
	for round := range 4 {
		s := []*Snapshot{a, b}[round%2]
		for i := range ins {
			var want, got Result
			x, y := ins[i], ins[i]
			s.Attribute(&x, &want)
			s.AttributeMemo(&m, &y, &got)
			if got != want {
				t.Fatalf("round %d record %d: memo %+v, plain %+v", round, i, got, want)
			}
		}
	}
}

// TestLookupPrefixRange: the range lookupPrefix returns holds the same
// answer at both ends, and just outside it a different table interval
// starts (the Memo relies on the first).
func TestLookupPrefixRange(t *testing.T) {
	s := realistic(t)
	for _, x := range mixedTraffic(t, 4096) {
		vme, ok := s.lookupMAC(x.VMMAC, x.NowUS)
		r := x.RemoteIP.Unmap()
		if !ok || !r.IsValid() {
			continue
		}
		k, v6 := addrKey(r), !r.Is4()
		i, lo, hi := s.lookupPrefixRange(vme.tenant, vme.domain, k, v6)
		if want := s.lookupPrefix(vme.tenant, vme.domain, r); (want == nil) != (i < 0) || (i >= 0 && want != &s.vals[i]) {
			t.Fatalf("%v: ranged lookup %d, plain %v", r, i, want)
		}
		if lo.less(u128{}) || hi.less(lo) || k.less(lo) || hi.less(k) {
			t.Fatalf("%v: range [%v, %v] does not hold the address", r, lo, hi)
		}
		for _, e := range []u128{lo, hi} {
			if j, l2, h2 := s.lookupPrefixRange(vme.tenant, vme.domain, e, v6); j != i || l2 != lo || h2 != hi {
				t.Fatalf("%v: range [%v, %v] end %v answers %d [%v, %v], want %d", r, lo, hi, e, j, l2, h2, i)
			}
		}
	}
}
