package snapshot

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/schemas"
)

// mixedTraffic is a record mix over the realistic cloud: internet both
// ways, L2 same tenant, routed to the tenant's other subnet, infra (DHCP,
// gateway, metadata), load balancer segments 1 and 2, multicast, IPv6 and
// unknown MACs.
func mixedTraffic(tb testing.TB, n int) []Input {
	return mixedTrafficOver(tb, n, synth.Realistic.Tenants)
}

// mixedTrafficOver draws the VMs from the first tenants only: 4 tenants ≈
// the 40 VMs of one hypervisor, the working set an agent really has.
func mixedTrafficOver(tb testing.TB, n, tenants int) []Input {
	return mixedTrafficRuns(tb, n, tenants, 1)
}

// mixedTrafficRuns is mixedTrafficOver with the VM drawn once per run of
// records (clustered, as when a VM's flows end together); run 1 is
// mixedTrafficOver's random order.
func mixedTrafficRuns(tb testing.TB, n, tenants, run int) []Input {
	tb.Helper()
	o := synth.Realistic
	o.Tenants = tenants
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Now().UnixMicro()
	out := make([]Input, n)
	var t, v int
	for i := range out {
		if i%run == 0 {
			t, v = rng.IntN(o.Tenants), rng.IntN(o.VMsPerTenant)
		}
		vm, ip := mustMAC(tb, synth.VMMAC(t, v)), netip.MustParseAddr(synth.VMIP(t, v))
		router := mustMAC(tb, synth.RouterMAC(t, v%2))
		x := Input{NowUS: now, Dir: schemas.DirTX + schemas.Direction(i%2), VMMAC: vm, LocalIP: ip}
		switch r := rng.IntN(100); {
		case r < 40: // internet
			x.PeerMAC, x.RemoteIP = router, netip.AddrFrom4([4]byte{byte(1 + rng.IntN(200)), byte(rng.IntN(256)), 8, 8})
		case r < 60: // L2 same tenant
			w := (v + 2) % o.VMsPerTenant
			x.PeerMAC, x.RemoteIP = mustMAC(tb, synth.VMMAC(t, w)), netip.MustParseAddr(synth.VMIP(t, w))
		case r < 70: // routed to the other subnet
			w := (v + 1) % o.VMsPerTenant
			x.PeerMAC, x.RemoteIP = router, netip.MustParseAddr(synth.VMIP(t, w))
		case r < 75: // infra
			x.PeerMAC, x.RemoteIP = router, netip.MustParseAddr("169.254.169.254")
		case r < 80: // shared network
			x.PeerMAC, x.RemoteIP = router, netip.MustParseAddr(fmt.Sprintf("100.64.%d.%d", rng.IntN(256), rng.IntN(256)))
		case r < 88: // load balancer: client ↔ VIP and amphora ↔ member
			l := rng.IntN(o.LoadBalancers)
			amp := mustMAC(tb, synth.AmphoraMAC(l, 0))
			if r < 84 {
				x.VMMAC, x.PeerMAC, x.LocalIP, x.RemoteIP = amp, router, netip.MustParseAddr(synth.VIP(l)), netip.AddrFrom4([4]byte{198, 51, 100, byte(rng.IntN(256))})
			} else {
				x.VMMAC, x.PeerMAC, x.LocalIP, x.RemoteIP = amp, mustMAC(tb, synth.VMMAC(l, 0)), netip.MustParseAddr(synth.AmphoraIP(l, 0)), netip.MustParseAddr(synth.VMIP(l, 0))
			}
		case r < 92: // multicast
			x.Dir, x.PeerMAC, x.RemoteIP = schemas.DirTX, mustMAC(tb, "01:00:5e:00:00:fb"), netip.MustParseAddr("224.0.0.251")
		case r < 97: // IPv6 internet
			x.PeerMAC, x.LocalIP, x.RemoteIP = router, netip.MustParseAddr("fd00:0:1::10"), netip.MustParseAddr("2001:4860::8888")
		default: // unknown VM
			x.VMMAC, x.PeerMAC, x.RemoteIP = mustMAC(tb, "fa:16:3e:99:99:99"), router, netip.MustParseAddr("8.8.8.8")
		}
		out[i] = x
	}
	return out
}

func realistic(tb testing.TB) *Snapshot {
	tb.Helper()
	o := synth.Realistic
	o.WithIPv6 = true
	s := Build(synth.Generate(o), Options{Version: 1})
	st := s.Stats()
	if st.Endpoints < 10000 || st.Tenants < 1000 || st.AmphoraMACs != 200 {
		tb.Fatalf("generated cloud too small: %+v", st)
	}
	return s
}

// TestAttributeZeroAlloc pins the hot path at zero allocations, for the
// parsed Input and for the textual Flow wrapper.
func TestAttributeZeroAlloc(t *testing.T) {
	s := realistic(t)
	ins := mixedTraffic(t, 1024)
	var r Result
	i := 0
	if a := testing.AllocsPerRun(5000, func() {
		x := ins[i%len(ins)]
		s.Attribute(&x, &r)
		i++
	}); a != 0 {
		t.Errorf("Attribute: %v allocs/record, want 0", a)
	}
	flows := toFlows(ins)
	f := make([]schemas.Flow, len(flows))
	if a := testing.AllocsPerRun(5000, func() {
		k := i % len(flows)
		f[k] = flows[k]
		_ = s.AttributeFlow(&f[k], ins[0].NowUS, &r)
		i++
	}); a != 0 {
		t.Errorf("AttributeFlow: %v allocs/record, want 0", a)
	}
}

// TestAttributeFlowBinaryAgrees: the mixed traffic (internet, L2, routed,
// infra, shared, LB, multicast, IPv6, unknown MACs) attributes the same
// from the binary form as from text, with no allocation.
func TestAttributeFlowBinaryAgrees(t *testing.T) {
	s := realistic(t)
	ins := mixedTraffic(t, 4096)
	text, bin := toFlows(ins), toBinFlows(ins)
	var rt, rb Result
	for i := range text {
		et := s.AttributeFlow(&text[i], ins[0].NowUS, &rt)
		eb := s.AttributeFlow(&bin[i], ins[0].NowUS, &rb)
		if et != eb || rt != rb {
			t.Fatalf("record %d (%+v): text %+v (err %v), binary %+v (err %v)", i, ins[i], rt, et, rb, eb)
		}
		if bin[i].Bin.Zone != rb.Zone || bin[i].Zone != rb.Zone.String() {
			t.Fatalf("record %d: stamped zone %v / %q, want %v", i, bin[i].Bin.Zone, bin[i].Zone, rb.Zone)
		}
	}
	i := 0
	if a := testing.AllocsPerRun(5000, func() {
		_ = s.AttributeFlow(&bin[i%len(bin)], ins[0].NowUS, &rb)
		i++
	}); a != 0 {
		t.Errorf("AttributeFlow on binary records: %v allocs/record, want 0", a)
	}
}

func toFlows(ins []Input) []schemas.Flow {
	out := make([]schemas.Flow, len(ins))
	for i, x := range ins {
		f := &out[i]
		f.Direction, f.VMMAC, f.PeerMAC = x.Dir.String(), FormatMAC(x.VMMAC), FormatMAC(x.PeerMAC)
		src, dst := x.LocalIP, x.RemoteIP
		if x.Dir == schemas.DirRX {
			src, dst = dst, src
		}
		f.SrcIP, f.DstIP = src.String(), dst.String()
	}
	return out
}

// BenchmarkEnrich attributes a realistic mixed record stream against a
// 10,000-port, 1,000-tenant, 2,000-subnet, 100-LB snapshot.
func BenchmarkEnrich(b *testing.B) {
	s := realistic(b)
	ins := mixedTraffic(b, 1<<16)
	local := mixedTrafficOver(b, 1<<12, 4)
	b.Run("Attribute/node-local", func(b *testing.B) {
		var r Result
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x := local[i&(len(local)-1)]
			s.Attribute(&x, &r)
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
	})
	b.Run("Attribute/all-tenants", func(b *testing.B) {
		var r Result
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x := ins[i&(len(ins)-1)]
			s.Attribute(&x, &r)
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
	})
	b.Run("AttributeFlow", func(b *testing.B) {
		flows := toFlows(ins)
		now := ins[0].NowUS
		var r Result
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_ = s.AttributeFlow(&flows[i&(len(flows)-1)], now, &r)
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
	})
	// the same records in the binary working form (schemas.FlowBin), as
	// the capture writes them (no parsing), against text, interleaved in
	// chunks of 4096 so both see the same load; CPU time of the process
	for _, set := range []struct {
		name string
		ins  []Input
	}{{"node-local", local}, {"all-tenants", ins}} {
		b.Run("AttributeFlowVersus/"+set.name, func(b *testing.B) {
			text, bin := toFlows(set.ins), toBinFlows(set.ins)
			now := set.ins[0].NowUS
			var r Result
			var tText, tBin time.Duration
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				t0 := cpuTime()
				for i := range text {
					_ = s.AttributeFlow(&text[i], now, &r)
				}
				t1 := cpuTime()
				for i := range bin {
					_ = s.AttributeFlow(&bin[i], now, &r)
				}
				tText, tBin = tText+t1-t0, tBin+cpuTime()-t1
				n += len(text)
			}
			b.ReportMetric(float64(tBin.Nanoseconds())/float64(n), "binary_cpu_ns/record")
			b.ReportMetric(float64(tText.Nanoseconds())/float64(n), "text_cpu_ns/record")
			b.ReportMetric(float64(tText)/float64(tBin), "text_vs_binary")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkAttributeMemo: Attribute through a Memo (one lookup per
// distinct MAC and address range, the Engine's batch path) against
// Attribute per record, interleaved over the same records so both see the
// same load; CPU time of the process. node-local is one hypervisor's
// working set (≈40 VMs), 100-tenants ≈1,000 VMs, all-tenants 10,000 VMs
// in random order, where the memo mostly misses (its worst case: the
// memo's gates turn it off); -clustered the same with each VM's records
// in runs of 16.
func BenchmarkAttributeMemo(b *testing.B) {
	s := realistic(b)
	for _, set := range []struct {
		name string
		ins  []Input
	}{
		{"node-local", mixedTrafficOver(b, 1<<14, 4)},
		{"all-tenants", mixedTraffic(b, 1<<14)},
		{"100-tenants", mixedTrafficOver(b, 1<<14, 100)},
		{"node-local-clustered", mixedTrafficRuns(b, 1<<14, 4, 16)},
		{"100-tenants-clustered", mixedTrafficRuns(b, 1<<14, 100, 16)},
		{"all-tenants-clustered", mixedTrafficRuns(b, 1<<14, synth.Realistic.Tenants, 16)},
	} {
		b.Run(set.name, func(b *testing.B) {
			var m Memo
			var r Result
			var tPlain, tMemo time.Duration
			n := 0
			b.ReportAllocs()
			plain := func() {
				for i := range set.ins {
					s.Attribute(&set.ins[i], &r)
				}
			}
			memo := func() {
				for i := range set.ins {
					s.AttributeMemo(&m, &set.ins[i], &r)
				}
			}
			for b.Loop() {
				// each goes first every other pass: the second pass of
				// the same records runs on the first one's caches
				first, second, tFirst, tSecond := plain, memo, &tPlain, &tMemo
				if n/len(set.ins)%2 == 1 {
					first, second, tFirst, tSecond = memo, plain, &tMemo, &tPlain
				}
				t0 := cpuTime()
				first()
				t1 := cpuTime()
				second()
				*tFirst, *tSecond = *tFirst+t1-t0, *tSecond+cpuTime()-t1
				n += len(set.ins)
			}
			b.ReportMetric(float64(tMemo.Nanoseconds())/float64(n), "memo_cpu_ns/record")
			b.ReportMetric(float64(tPlain.Nanoseconds())/float64(n), "plain_cpu_ns/record")
			b.ReportMetric(float64(tPlain)/float64(tMemo), "plain_vs_memo")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// toBinFlows is toFlows in the binary form only (text fields empty).
func toBinFlows(ins []Input) []schemas.Flow {
	out := make([]schemas.Flow, len(ins))
	for i, x := range ins {
		f := &out[i]
		src, dst := x.LocalIP, x.RemoteIP
		if x.Dir == schemas.DirRX {
			src, dst = dst, src
		}
		f.Direction = x.Dir.String()
		f.Bin = schemas.FlowBin{Valid: true, Dir: x.Dir, VMMAC: x.VMMAC, PeerMAC: x.PeerMAC, SrcIP: src, DstIP: dst}
	}
	return out
}

func BenchmarkBuild(b *testing.B) {
	o := synth.Realistic
	o.WithIPv6 = true
	inv := synth.Generate(o)
	b.ReportAllocs()
	for b.Loop() {
		Build(inv, Options{Version: 1})
	}
}

// BenchmarkChanged: the swap barrier's test of a new snapshot against the
// one in use (snapshot.Changed), at the attribution benchmark's size and
// at fleet size, for an unchanged inventory (the whole walk: the worst
// case). Baseline in the same run: Build of that snapshot, which every
// swap pays anyway. (make bench skips the Fleet half, as it skips every
// Fleet benchmark in its quick line.)
func BenchmarkChanged(b *testing.B) {
	for _, c := range []struct {
		name string
		o    synth.Options
	}{{"realistic", synth.Realistic}, {"Fleet", synth.Fleet}} {
		inv := synth.Generate(c.o)
		now := time.Now()
		prev := Build(inv, Options{Version: 1, Now: now})
		next := Build(inv, Options{Version: 2, Now: now, Prev: prev})
		b.Run(c.name+"/changed", func(b *testing.B) {
			for b.Loop() {
				if why := next.Changed(prev, now.UnixMicro()); why != "" {
					b.Fatalf("same inventory changed: %s", why)
				}
			}
		})
		b.Run(c.name+"/build", func(b *testing.B) {
			for b.Loop() {
				Build(inv, Options{Version: 2, Now: now, Prev: prev})
			}
		})
	}
}
