//go:build linux

package bpf

import (
	"bytes"
	"maps"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestParseTable(t *testing.T) {
	type want struct {
		nonIP    bool
		ethProto uint16
		proto    uint8
		vlan     uint16
		src, dst [16]byte
		sport    uint16
		dport    uint16
		flags    uint32
	}
	v4 := func(proto uint8, sp, dp uint16) want {
		return want{ethProto: 0x0800, proto: proto, src: ip4in6("10.0.0.1"), dst: ip4in6("10.0.0.2"), sport: sp, dport: dp}
	}
	v6 := func(proto uint8, sp, dp uint16) want {
		return want{ethProto: 0x86dd, proto: proto, src: ip16("fd00::1"), dst: ip16("fd00::2"), sport: sp, dport: dp}
	}
	with := func(w want, f func(*want)) want { f(&w); return w }

	cases := []struct {
		name  string
		dir   Direction
		frame []byte
		want  want
	}{
		{"v4 tcp syn", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{}, tcp(40000, 443, 0x02, nil))),
			with(v4(6, 40000, 443), func(w *want) { w.flags = 0x02 })},
		{"v4 tcp ack+psh with payload, rx", DirRX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{}, tcp(40000, 443, 0x18, pad(1000)))),
			with(v4(6, 40000, 443), func(w *want) { w.flags = 0x18 })},
		{"v4 udp", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(5353, 53, pad(30)))), v4(17, 5353, 53)},
		{"v4 sctp", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 132, v4opts{}, sctp(3868, 3869))), v4(132, 3868, 3869)},
		{"v4 icmp echo: type→src_port code→dst_port", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 1, v4opts{}, icmp(8, 0, pad(56)))), v4(1, 8, 0)},
		{"v4 icmp unreachable code 3", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 1, v4opts{}, icmp(3, 3, pad(28)))), v4(1, 3, 3)},
		{"v4 with 8 bytes of options", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{options: []byte{0x94, 4, 0, 0, 1, 1, 1, 0}}, udp(1, 2, nil))), v4(17, 1, 2)},
		{"v4 max IHL 60", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{options: pad(40)}, udp(7, 9, nil))), v4(17, 7, 9)},
		{"v4 first fragment keeps ports", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{mf: true}, udp(1111, 2222, pad(100)))), v4(17, 1111, 2222)},
		{"v4 later fragment has no ports", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{fragOff: 185}, pad(100))), v4(17, 0, 0)},
		{"v4 bogus IHL 3: addresses only", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{ihl: 3}, tcp(1, 2, 0x10, nil))), v4(6, 0, 0)},
		{"v4 IHL beyond the frame", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{ihl: 15}, nil)), v4(6, 0, 0)},
		{"v4 truncated tcp header", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{}, []byte{1, 2, 3})), v4(6, 0, 0)},
		{"802.1Q v4 udp", DirTX, vlanEth(macB, macA, 42, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(10, 20, nil))),
			with(v4(17, 10, 20), func(w *want) { w.vlan = 42 })},
		{"802.1Q v6 tcp", DirRX, vlanEth(macB, macA, 4094, 0x86dd, ipv6("fd00::1", "fd00::2", 6, tcp(5, 6, 0x10, nil))),
			with(v6(6, 5, 6), func(w *want) { w.vlan = 4094; w.flags = 0x10 })},
		{"v6 udp", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 17, udp(546, 547, pad(20)))), v6(17, 546, 547)},
		{"v6 icmpv6 echo", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 58, icmp(128, 0, pad(8)))), v6(58, 128, 0)},
		{"v6 sctp", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 132, sctp(1, 2))), v6(132, 1, 2)},
		{"v6 hop-by-hop + dest opts + tcp", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 0, ext6(60, 0, ext6(6, 1, tcp(80, 8080, 0x12, nil))))),
			with(v6(6, 80, 8080), func(w *want) { w.flags = 0x12 })},
		{"v6 routing + AH + udp", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 43, ext6(51, 2, ah6(17, udp(9, 10, nil))))), v6(17, 9, 10)},
		{"v6 first fragment keeps ports", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 44, frag6(17, 0, true, udp(3, 4, pad(50))))), v6(17, 3, 4)},
		{"v6 later fragment has no ports", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 44, frag6(17, 100, false, pad(50)))), v6(17, 0, 0)},
		{"v6 ESP stops the walk", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 50, pad(40))), v6(50, 0, 0)},
		{"v6 chain longer than the walk bound", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 60,
			ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(17, 0, udp(1, 2, nil)))))))))), v6(60, 0, 0)},
		{"v6 extension header length beyond the frame", DirTX, eth(macB, macA, 0x86dd, ipv6("fd00::1", "fd00::2", 0, []byte{17, 200})), v6(17, 0, 0)},
		{"ARP is not IP", DirTX, eth(macB, macA, 0x0806, pad(28)), want{nonIP: true}},
		{"LLDP is not IP", DirRX, eth(macB, macA, 0x88cc, pad(46)), want{nonIP: true}},
		{"802.1Q ARP is not IP", DirTX, vlanEth(macB, macA, 7, 0x0806, pad(28)), want{nonIP: true}},
		{"802.1Q tag truncated", DirTX, append(eth(macB, macA, 0x8100, nil), 0x00), want{nonIP: true}},
		// BPF_PROG_TEST_RUN takes at most a page minus skb overhead, and
		// rejects IP frames shorter than their IP header (v4 and v6); jumbo
		// and GSO frames are covered by the netns test and the fuzz test.
		{"large v4 udp 3500", DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(1, 2, pad(3500-28)))), v4(17, 1, 2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := loadForTest(t, Spec{})
			run(t, o, tc.dir, tc.frame)
			m := meter(t, o, tc.dir)
			flows := dumpFlows(t, o)
			if tc.want.nonIP {
				if len(flows) != 0 || m.Packets != 0 || m.SkippedPackets != 1 || m.SkippedBytes != uint64(len(tc.frame)) {
					t.Fatalf("non-IP: flows %d, meter %+v", len(flows), m)
				}
				return
			}
			if m.Packets != 1 || m.Bytes != uint64(len(tc.frame)) || m.SkippedPackets != 0 {
				t.Fatalf("meter %+v, want 1 packet of %d bytes", m, len(tc.frame))
			}
			if len(flows) != 1 {
				t.Fatalf("%d flows, want 1", len(flows))
			}
			k, v := flows[0].K, flows[0].V
			w := tc.want
			if k.Ifindex != loIfindex || Direction(k.Direction) != tc.dir || k.SrcMac != macA || k.DstMac != macB {
				t.Errorf("key ifindex/dir/macs: %+v", k)
			}
			if k.EthProto != w.ethProto || k.Protocol != w.proto || k.VlanId != w.vlan || k.SrcPort != w.sport || k.DstPort != w.dport {
				t.Errorf("key eth %#x proto %d vlan %d ports %d→%d; want eth %#x proto %d vlan %d ports %d→%d",
					k.EthProto, k.Protocol, k.VlanId, k.SrcPort, k.DstPort, w.ethProto, w.proto, w.vlan, w.sport, w.dport)
			}
			if !bytes.Equal(k.SrcIp[:], w.src[:]) || !bytes.Equal(k.DstIp[:], w.dst[:]) {
				t.Errorf("key ips %x → %x, want %x → %x", k.SrcIp, k.DstIp, w.src, w.dst)
			}
			if v.Bytes != uint64(len(tc.frame)) || v.Packets != 1 || v.TcpFlags != w.flags || v.FirstNs == 0 || v.LastNs != v.FirstNs || v.Dead != 0 {
				t.Errorf("value %+v, want 1 packet of %d bytes, flags %#x", v, len(tc.frame), w.flags)
			}
		})
	}
}

// TestAggregateAndFINRST: packets of one flow add up; FIN and RST export the
// entry (with the closing packet) and remove it; a flow that starts with a
// FIN is exported on its own.
func TestAggregateAndFINRST(t *testing.T) {
	frame := func(flags uint8, n int) []byte {
		return eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{}, tcp(40000, 80, flags, pad(n))))
	}
	for _, tc := range []struct {
		name   string
		last   uint8
		reason EndReason
	}{{"fin", 0x11, EndFIN}, {"rst", 0x04, EndRST}, {"rst+ack", 0x14, EndRST}} {
		t.Run(tc.name, func(t *testing.T) {
			o := loadForTest(t, Spec{})
			var total uint64
			for i, f := range []uint8{0x02, 0x10, 0x18, 0x18} {
				fr := frame(f, i*100)
				total += uint64(len(fr))
				run(t, o, DirTX, fr)
			}
			if fl := dumpFlows(t, o); len(fl) != 1 || fl[0].V.Packets != 4 || fl[0].V.Bytes != total || fl[0].V.TcpFlags != 0x1a {
				t.Fatalf("before close: %+v", fl)
			}
			if recs := drainRing(t, o); len(recs) != 0 {
				t.Fatalf("records before close: %+v", recs)
			}
			last := frame(tc.last, 0)
			total += uint64(len(last))
			run(t, o, DirTX, last)
			if fl := dumpFlows(t, o); len(fl) != 0 {
				t.Fatalf("entry not removed after %s: %+v", tc.name, fl)
			}
			recs := drainRing(t, o)
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1", len(recs))
			}
			r := recs[0]
			if EndReason(r.EndReason) != tc.reason || r.Val.Packets != 5 || r.Val.Bytes != total || r.Val.TcpFlags != uint32(0x1a|tc.last) || r.Key.SrcPort != 40000 {
				t.Fatalf("record %+v, want %s with 5 packets %d bytes", r, tc.reason, total)
			}
			m := meter(t, o, DirTX)
			if m.Packets != 5 || m.Bytes != total || m.Records != 1 || m.LostBytes != 0 {
				t.Fatalf("meter %+v", m)
			}
			// A lone FIN (no entry) is exported at once.
			run(t, o, DirTX, frame(0x11, 0))
			if recs := drainRing(t, o); len(recs) != 1 || EndReason(recs[0].EndReason) != EndFIN || recs[0].Val.Packets != 1 {
				t.Fatalf("lone FIN: %+v", recs)
			}
			if fl := dumpFlows(t, o); len(fl) != 0 {
				t.Fatalf("lone FIN left an entry: %+v", fl)
			}
		})
	}
}

// TestOverflow: with a table of 4 entries, the 5th..Nth flows are exported
// as overflow records, counted as failed updates, and the bytes still add
// up: packet by packet without the flow cache, slot by slot (2 packets)
// when the flush merges the cache.
func TestOverflow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noCache bool
		recPkts uint64
	}{{"table", true, 1}, {"cache", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			o := loadForTest(t, Spec{FlowEntries: 4, NoCache: tc.noCache})
			var total uint64
			for i := 0; i < 10; i++ {
				for j := 0; j < 2; j++ {
					fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(uint16(1000+i), 53, pad(10*i))))
					total += uint64(len(fr))
					run(t, o, DirRX, fr)
				}
			}
			if _, deferred, err := o.FlushCache(); err != nil || deferred {
				t.Fatalf("flush: deferred %v, %v", deferred, err)
			}
			flows := dumpFlows(t, o)
			recs := drainRing(t, o)
			if len(flows) != 4 {
				t.Fatalf("%d entries, want 4", len(flows))
			}
			var sum, pk uint64
			for _, f := range flows {
				sum += f.V.Bytes
				pk += f.V.Packets
			}
			for _, r := range recs {
				if EndReason(r.EndReason) != EndOverflow || r.Val.Packets != tc.recPkts {
					t.Fatalf("record %+v, want overflow of %d packets", r, tc.recPkts)
				}
				sum += r.Val.Bytes
				pk += r.Val.Packets
			}
			m := meter(t, o, DirRX)
			if want := int(12 / tc.recPkts); len(recs) != want || m.FailedUpdates != uint64(want) {
				t.Fatalf("%d overflow records, %d failed updates; want %d", len(recs), m.FailedUpdates, want)
			}
			if sum != total || pk != 20 || m.Bytes != total || m.Packets != 20 {
				t.Fatalf("Σ bytes %d packets %d, meter %+v, want %d bytes 20 packets", sum, pk, m, total)
			}
		})
	}
}

// TestRingFullCountsLoss: when the ring buffer is full, the overflow records
// that cannot be submitted are counted as lost, packet and byte exact. A
// one-slot flow cache makes every new flow merge the previous one on the
// packet path.
func TestRingFullCountsLoss(t *testing.T) {
	o := loadForTest(t, Spec{FlowEntries: 1, RingBytes: 4096, CacheSlots: 1})
	var total uint64
	for i := 0; i < 100; i++ {
		fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(uint16(i), 53, pad(i))))
		total += uint64(len(fr))
		run(t, o, DirTX, fr)
	}
	var exported, pk uint64
	for _, f := range dumpFlows(t, o) {
		exported += f.V.Bytes
		pk += f.V.Packets
	}
	for _, r := range drainRing(t, o) {
		exported += r.Val.Bytes
		pk += r.Val.Packets
	}
	m := meter(t, o, DirTX)
	if m.LostPackets == 0 {
		t.Fatalf("a 4 KiB ring took 99 records: %+v", m)
	}
	if exported+m.LostBytes != total || pk+m.LostPackets != 100 || m.Bytes != total {
		t.Fatalf("exported %d + lost %d != %d (meter %+v)", exported, m.LostBytes, total, m)
	}
}

// TestSweep: idle flows are exported and removed; busy ones stay; a sweep
// with idle 0 (shutdown) takes everything; a full ring defers.
func TestSweep(t *testing.T) {
	o := loadForTest(t, Spec{})
	for i := 0; i < 5; i++ {
		run(t, o, DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(uint16(i+1), 53, pad(i)))))
	}
	res, err := o.Sweep(time.Hour, EndIdleTimeout, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if res.Scanned != 5 || res.Exported != 0 || res.Deleted != 0 || res.Deferred || res.Now == 0 {
		t.Fatalf("sweep of busy flows: %+v", res)
	}
	time.Sleep(30 * time.Millisecond) // > a coarse-clock tick
	res, err = o.Sweep(10*time.Millisecond, EndIdleTimeout, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Exported != 2 || res.Deleted != 2 || !res.Deferred {
		t.Fatalf("capped sweep: %+v", res)
	}
	res, err = o.Sweep(0, EndShutdown, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if res.Exported != 3 || res.Deleted != 3 || res.Deferred {
		t.Fatalf("shutdown sweep: %+v", res)
	}
	recs := drainRing(t, o)
	reasons := map[EndReason]int{}
	var b uint64
	for _, r := range recs {
		reasons[EndReason(r.EndReason)]++
		b += r.Val.Bytes
	}
	if reasons[EndIdleTimeout] != 2 || reasons[EndShutdown] != 3 || b != meter(t, o, DirTX).Bytes {
		t.Fatalf("records %v, bytes %d", reasons, b)
	}
	if len(dumpFlows(t, o)) != 0 {
		t.Fatal("flows left after shutdown sweep")
	}
}

func TestActiveTimeout(t *testing.T) {
	o := loadForTest(t, Spec{ActiveTimeout: time.Second})
	fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(9, 9, pad(100))))
	run(t, o, DirTX, fr)
	run(t, o, DirTX, fr)
	time.Sleep(1100 * time.Millisecond)
	run(t, o, DirTX, fr)
	recs := drainRing(t, o)
	if len(recs) != 1 || EndReason(recs[0].EndReason) != EndActiveTimeout || recs[0].Val.Packets != 3 || recs[0].Val.Bytes != 3*uint64(len(fr)) {
		t.Fatalf("records %+v, want one active_timeout record of 3 packets", recs)
	}
	if d := recs[0].Val.LastNs - recs[0].Val.FirstNs; d < uint64(time.Second) {
		t.Fatalf("record spans %dns, want ≥ 1s", d)
	}
	fl := dumpFlows(t, o)
	if len(fl) != 1 || fl[0].V.Packets != 0 || fl[0].V.Bytes != 0 || fl[0].V.FirstNs != recs[0].Val.LastNs {
		t.Fatalf("entry after export: %+v", fl)
	}
	run(t, o, DirTX, fr)
	if fl := dumpFlows(t, o); fl[0].V.Packets != 1 {
		t.Fatalf("entry keeps counting: %+v", fl)
	}
}

// TestUnregisteredInterface: frames of an ifindex without a slot go to
// slot 0 and are still aggregated.
func TestUnregisteredInterface(t *testing.T) {
	o := loadForTest(t, Spec{})
	if err := o.ClearSlot(loIfindex); err != nil {
		t.Fatal(err)
	}
	fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(9, 9, nil)))
	run(t, o, DirTX, fr)
	m0, err := o.ReadMeter(0, DirTX)
	if err != nil {
		t.Fatal(err)
	}
	if m0.Packets != 1 || meter(t, o, DirTX).Packets != 0 || len(dumpFlows(t, o)) != 1 {
		t.Fatalf("slot 0 meter %+v", m0)
	}
}

// TestCountSpill: 2^24+3 packets of one flow, counted in the kernel, add
// up exactly. Without the flow cache the packed per-entry counter
// (packets << 40 | bytes) is moved into the 64-bit counters before its
// packet half (2^24) overflows; with it, the cache slot's 64-bit counters
// are merged into the entry's.
func TestCountSpill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs 2×16M packets")
	}
	for _, noCache := range []bool{true, false} {
		t.Run(map[bool]string{true: "table", false: "cache"}[noCache], func(t *testing.T) { countSpill(t, noCache) })
	}
}

func countSpill(t *testing.T, noCache bool) {
	o := loadForTest(t, Spec{NoCache: noCache})
	fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(9, 9, pad(100))))
	const n = 1<<24 + 3
	if _, _, err := o.Ingress().Benchmark(fr, n, nil); err != nil {
		t.Fatal(err)
	}
	if _, deferred, err := o.FlushCache(); err != nil || deferred {
		t.Fatalf("flush: deferred %v, %v", deferred, err)
	}
	fl := dumpFlows(t, o)
	m := meter(t, o, DirTX)
	if len(fl) != 1 || fl[0].V.Packets != n || fl[0].V.Bytes != n*uint64(len(fr)) || m.Packets != n || m.Bytes != fl[0].V.Bytes {
		t.Fatalf("flows %+v meter %+v, want %d packets of %d bytes", fl, m, n, len(fr))
	}
	if recs := drainRing(t, o); len(recs) != 0 {
		t.Fatalf("records %+v", recs)
	}
	var raw FlowEnt
	var k FlowKey4
	if it := o.objs.Flows4.Iterate(); !it.Next(&k, &raw) || raw.Packets == 0 || raw.Count>>flowCountPktShift >= 1<<23 || (!noCache && raw.Packets != n) {
		t.Fatalf("entry %+v: the count was never spilled", raw)
	}
	// The spilled entry still exports exactly (shutdown sweep).
	if _, err := o.Sweep(0, EndShutdown, 10); err != nil {
		t.Fatal(err)
	}
	recs := drainRing(t, o)
	if len(recs) != 1 || recs[0].Val.Packets != n || recs[0].Val.Bytes != m.Bytes {
		t.Fatalf("records %+v", recs)
	}
}

// TestFlushDefersOnFullRing: 100 cached flows and a 1-entry table: the
// flush merges them as overflow records into a 4 KiB ring, stops while the
// ring is low (deferred), and resumes after a drain: every byte arrives,
// none is lost, and no slot stays in the cache.
func TestFlushDefersOnFullRing(t *testing.T) {
	o := loadForTest(t, Spec{FlowEntries: 1, RingBytes: 4096})
	var total uint64
	for i := 0; i < 100; i++ {
		fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(uint16(i), 53, pad(i))))
		total += uint64(len(fr))
		run(t, o, DirTX, fr)
	}
	var got uint64
	deferrals := 0
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("flush still deferred after 100 drains")
		}
		_, deferred, err := o.FlushCache()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range drainRing(t, o) {
			got += r.Val.Bytes
		}
		if !deferred {
			break
		}
		deferrals++
	}
	if n, err := o.CachedFlows(); err != nil || n != 0 {
		t.Fatalf("%d slots left in the cache (%v)", n, err)
	}
	for _, f := range dumpFlows(t, o) {
		got += f.V.Bytes
	}
	m := meter(t, o, DirTX)
	if deferrals == 0 || m.LostBytes != 0 || got != total || m.Bytes != total {
		t.Fatalf("deferrals %d, exported %d of %d bytes, meter %+v", deferrals, got, total, m)
	}
}

// TestEvictedFlowCountsOnItsMeter: a flow evicted from the cache by a
// packet of another interface is merged with the meter of its own
// interface: its failed insert (the table is full) counts there, not on
// the interface of the packet that evicted it. The second interface is a
// veth in a namespace of the test's own.
func TestEvictedFlowCountsOnItsMeter(t *testing.T) {
	o := loadForTest(t, Spec{FlowEntries: 1, CacheSlots: 1}) // pins the thread
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // this thread only
	if err != nil {
		t.Fatalf("new netns: %v", err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err)
		}
		ns.Close()
	}()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tfdummy0"}, PeerName: "tfdummy1"}); err != nil {
		t.Fatalf("add veth pair: %v", err)
	}
	l, err := netlink.LinkByName("tfdummy0")
	if err != nil {
		t.Fatal(err)
	}
	dummy := uint32(l.Attrs().Index)
	if err := o.SetSlot(dummy, 2); err != nil {
		t.Fatal(err)
	}
	send := func(ifindex uint32, sport uint16) {
		t.Helper()
		var ctx [11]uint32 // struct __sk_buff up to ifindex
		ctx[10] = ifindex
		fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(sport, 53, pad(10))))
		if _, err := o.Ingress().Run(&ebpf.RunOptions{Data: fr, Context: ctx}); err != nil {
			t.Fatalf("test run on ifindex %d: %v", ifindex, err)
		}
	}
	send(loIfindex, 1) // X in the empty slot
	send(dummy, 3)     // Z's first packet: the table (its one entry)
	send(dummy, 3)     // Z's second in a row is admitted, evicts X: X's insert fails
	lo, err := o.ReadMeter(1, DirTX)
	if err != nil {
		t.Fatal(err)
	}
	du, err := o.ReadMeter(2, DirTX)
	if err != nil {
		t.Fatal(err)
	}
	if lo.FailedUpdates != 1 || lo.Records != 1 || du.FailedUpdates != 0 || lo.Packets != 1 || du.Packets != 2 {
		t.Fatalf("lo meter %+v, dummy meter %+v; want X's failed insert on lo", lo, du)
	}
}

// TestFlipUnderConcurrentRuns: programs run flat out on every CPU (one
// pinned runner per CPU, 8 flows each, hits in the cache) while the flow
// cache is flipped and flushed back to back. The flip's wait for running
// programs is what keeps a slot from being merged while its CPU still adds
// to it: at the end (a shutdown sweep), Σ records equal the meters, byte
// and packet exact.
func TestFlipUnderConcurrentRuns(t *testing.T) {
	o := loadForTest(t, Spec{FlowEntries: 1 << 12, RingBytes: 1 << 22})
	cpus := runtime.NumCPU()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, cpus)
	for cpu := 0; cpu < cpus; cpu++ {
		wg.Add(1)
		go func(cpu int) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs <- err
				return
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fr := eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(uint16(cpu*100+i%8), 53, pad(i%8*10))))
				if _, _, err := o.Ingress().Benchmark(fr, 1000, nil); err != nil {
					errs <- err
					return
				}
			}
		}(cpu)
	}
	flips := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); flips++ {
		if _, deferred, err := o.FlushCache(); err != nil || deferred {
			t.Errorf("flush: deferred %v, %v", deferred, err)
			break
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("runner: %v", err)
	}
	var b, p uint64
	for {
		res, err := o.Sweep(0, EndShutdown, 1<<15)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range drainRing(t, o) {
			b += r.Val.Bytes
			p += r.Val.Packets
		}
		if !res.Deferred {
			break
		}
	}
	m := meter(t, o, DirTX)
	t.Logf("%d flips, %d packets on %d CPUs", flips, m.Packets, cpus)
	if flips < 10 || m.Packets < 100000 {
		t.Fatalf("%d flips, %d packets: too little to test", flips, m.Packets)
	}
	if n, err := o.CachedFlows(); err != nil || n != 0 {
		t.Fatalf("%d slots left in the cache (%v)", n, err)
	}
	if b != m.Bytes || p != m.Packets || m.LostBytes != 0 {
		t.Fatalf("Σ records %d packets %d bytes, meter %+v", p, b, m)
	}
}

// TestCacheAdmission: with one cache slot, a flow takes the slot when it
// is empty or on its second packet in a row; flows seen one packet at a
// time go to the table and never evict (issue 24: a miss costs no more
// than the table). A flush (a flip of the generations) leaves an empty
// slot. Every packet is counted exactly once, in the slot or the table.
// seq names flows by UDP source port; 0 flushes the cache.
func TestCacheAdmission(t *testing.T) {
	for _, tc := range []struct {
		name string
		seq  []uint16
		slot uint16 // the flow in the slot at the end
		pkts uint64 // its packets there
	}{
		{"an empty slot takes the first packet", []uint16{1}, 1, 1},
		{"flows one packet at a time stay in the table", []uint16{1, 2, 3, 2, 3, 4, 2}, 1, 1},
		{"the second packet in a row is admitted", []uint16{1, 2, 2, 2}, 2, 2},
		{"a hit in between resets the candidate", []uint16{1, 2, 1, 2, 1}, 1, 3},
		{"admitted back after an eviction", []uint16{1, 2, 2, 1, 1}, 1, 1},
		{"after a flush the slot's flow takes it back at once", []uint16{1, 1, 0, 1}, 1, 1},
		{"after a flush another flow takes it at once", []uint16{1, 0, 2, 2, 2}, 2, 3},
		{"a flush between a flow's two packets in a row: the empty slot takes it", []uint16{1, 2, 0, 2}, 2, 1},
		{"two flushes: the slot is empty", []uint16{1, 2, 2, 0, 0, 3}, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := loadForTest(t, Spec{FlowEntries: 16, CacheSlots: 1})
			want := map[uint16]uint64{}
			packets := 0
			for _, p := range tc.seq {
				if p == 0 {
					if _, deferred, err := o.FlushCache(); err != nil || deferred {
						t.Fatalf("flush: deferred %v, %v", deferred, err)
					}
					continue
				}
				run(t, o, DirTX, eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(p, 53, pad(10)))))
				want[p]++
				packets++
			}
			var slots []FlowCent
			if err := o.cacheSlots(func(c *FlowCent) { slots = append(slots, *c) }); err != nil {
				t.Fatal(err)
			}
			if len(slots) != 1 || slots[0].FlowKey().SrcPort != tc.slot || slots[0].Packets != tc.pkts {
				t.Fatalf("cache slots %+v, want flow %d with %d packets", slots, tc.slot, tc.pkts)
			}
			got := map[uint16]uint64{}
			for _, f := range dumpFlows(t, o) { // table and slot added up
				got[f.K.SrcPort] += f.V.Packets
			}
			if !maps.Equal(got, want) {
				t.Fatalf("packets per flow %v, want %v", got, want)
			}
			if m := meter(t, o, DirTX); m.Packets != uint64(packets) || m.FailedUpdates != 0 || m.Records != 0 {
				t.Fatalf("meter %+v, want %d packets and no record", m, packets)
			}
		})
	}
}

// TestCacheSlotFreedByClose: a FIN or RST of the slot's flow empties the
// slot and its admission state, so the next flow takes the slot at its
// first packet, as in an empty cache; the closed flow's record holds every
// packet.
func TestCacheSlotFreedByClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		last uint8
	}{{"fin", 0x11}, {"rst", 0x04}} {
		t.Run(tc.name, func(t *testing.T) {
			o := loadForTest(t, Spec{FlowEntries: 16, CacheSlots: 1})
			frame := func(sport uint16, flags uint8) []byte {
				return eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 6, v4opts{}, tcp(sport, 80, flags, pad(10))))
			}
			for _, f := range []uint8{0x02, 0x10, tc.last} {
				run(t, o, DirTX, frame(1, f))
			}
			if recs := drainRing(t, o); len(recs) != 1 || recs[0].Key.SrcPort != 1 || recs[0].Val.Packets != 3 {
				t.Fatalf("records after the close %+v, want flow 1 with 3 packets", recs)
			}
			run(t, o, DirTX, frame(2, 0x02))
			var slots []FlowCent
			if err := o.cacheSlots(func(c *FlowCent) { slots = append(slots, *c) }); err != nil {
				t.Fatal(err)
			}
			if len(slots) != 1 || slots[0].FlowKey().SrcPort != 2 || slots[0].Packets != 1 {
				t.Fatalf("cache slots %+v, want flow 2 with 1 packet", slots)
			}
		})
	}
}

// The flow cache's bypass (flow.bpf.c: CACHE_WINDOW, CACHE_MIN_HITS,
// CACHE_BYPASS).
const (
	cacheWindow = 1024
	cacheBypass = 65536
)

// TestCacheBypass: a CPU whose cache counted fewer than one probe in 16
// over a window of 1,024 (flows seen one packet at a time) sends the next
// 65,536 packets straight to the table, then probes again; a burst during
// the bypass is counted in the table, one after it is admitted as usual.
// Every packet is counted exactly once.
func TestCacheBypass(t *testing.T) {
	o := loadForTest(t, Spec{FlowEntries: 4 * cacheWindow, CacheSlots: 1})
	frame := func(sport uint16) []byte {
		return eth(macB, macA, 0x0800, ipv4("10.0.0.1", "10.0.0.2", 17, v4opts{}, udp(sport, 53, pad(10))))
	}
	runN := func(sport uint16, n int) {
		t.Helper()
		if _, _, err := o.Ingress().Benchmark(frame(sport), n, nil); err != nil {
			t.Fatal(err)
		}
	}
	bypass := func() uint32 {
		t.Helper()
		var st []flowCacheState
		if err := o.objs.CacheStates.Lookup(uint32(0), &st); err != nil {
			t.Fatal(err)
		}
		var sum uint32
		for _, s := range st {
			sum += s.Bypass
		}
		return sum
	}
	inSlot := func() (sport uint16, packets uint64) {
		t.Helper()
		var slots []FlowCent
		if err := o.cacheSlots(func(c *FlowCent) { slots = append(slots, *c) }); err != nil {
			t.Fatal(err)
		}
		if len(slots) != 1 {
			t.Fatalf("%d slots occupied, want 1", len(slots))
		}
		return slots[0].FlowKey().SrcPort, slots[0].Packets
	}

	for p := range cacheWindow - 1 { // flows 1..1023: flow 1 takes the empty slot
		runN(uint16(p+1), 1)
	}
	if got := bypass(); got != 0 {
		t.Fatalf("bypass %d before the window is full", got)
	}
	runN(cacheWindow, 1) // the window's last probe: no hit in it
	if got := bypass(); got != cacheBypass {
		t.Fatalf("bypass %d after a window without hits, want %d", got, cacheBypass)
	}
	bypasses := func(want uint64) {
		t.Helper()
		if n, err := o.CacheBypasses(); err != nil || n != want {
			t.Fatalf("CacheBypasses() = %d, %v; want %d", n, err, want)
		}
	}
	bypasses(1)
	const burst = 5000 // flow 5000 in a row: during the bypass, the table's
	runN(burst, 100)
	if p, n := inSlot(); p != 1 || n != 1 {
		t.Fatalf("slot holds flow %d (%d packets) during the bypass, want flow 1 (1)", p, n)
	}
	runN(burst, cacheBypass-100)
	if got := bypass(); got != 0 {
		t.Fatalf("bypass %d after %d packets, want 0", got, cacheBypass)
	}
	runN(burst, 3) // probing again: admitted at its second packet, then a hit
	if p, n := inSlot(); p != burst || n != 2 {
		t.Fatalf("slot holds flow %d (%d packets) after the bypass, want flow %d (2)", p, n, burst)
	}
	runN(burst, cacheWindow) // a window of hits: no bypass
	if got := bypass(); got != 0 {
		t.Fatalf("bypass %d after a window of hits", got)
	}
	bypasses(1)
	if p, n := inSlot(); p != burst || n != cacheWindow+2 {
		t.Fatalf("slot holds flow %d (%d packets), want flow %d (%d)", p, n, burst, cacheWindow+2)
	}

	want := map[uint16]uint64{burst: cacheBypass + 3 + cacheWindow}
	for p := range cacheWindow {
		want[uint16(p+1)] = 1
	}
	got := map[uint16]uint64{}
	for _, f := range dumpFlows(t, o) { // table and slot added up
		got[f.K.SrcPort] += f.V.Packets
	}
	if !maps.Equal(got, want) {
		t.Fatalf("packets per flow differ: %d flows, want %d; flow %d: %d packets, want %d", len(got), len(want), burst, got[burst], want[burst])
	}
	if m := meter(t, o, DirTX); m.Packets != 2*cacheWindow+cacheBypass+3 || m.FailedUpdates != 0 {
		t.Fatalf("meter %+v, want %d packets", m, 2*cacheWindow+cacheBypass+3)
	}
}
