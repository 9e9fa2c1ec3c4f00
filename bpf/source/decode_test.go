package source

import (
	"net/netip"
	"testing"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/schemas"
)

var (
	vmMAC   = [6]byte{0xfa, 0x16, 0x3e, 0x00, 0xab, 0x01}
	peerMAC = [6]byte{0xfa, 0x16, 0x3e, 0x00, 0xcd, 0x02}
)

func rec(dir bpf.Direction, ethProto uint16, proto uint8, src, dst string, sp, dp uint16, reason bpf.EndReason) capture.Record {
	var r capture.Record
	k := &r.Key
	k.Ifindex, k.Direction, k.EthProto, k.Protocol, k.SrcPort, k.DstPort, k.VlanId = 7, uint8(dir), ethProto, proto, sp, dp, 0
	if dir == bpf.DirTX {
		k.SrcMac, k.DstMac = vmMAC, peerMAC
	} else {
		k.SrcMac, k.DstMac = peerMAC, vmMAC
	}
	k.SrcIp = netip.MustParseAddr(src).As16()
	k.DstIp = netip.MustParseAddr(dst).As16()
	if ethProto == 0x0800 {
		k.SrcIp = netip.AddrFrom4(netip.MustParseAddr(src).As4()).As16()
		k.DstIp = netip.AddrFrom4(netip.MustParseAddr(dst).As4()).As16()
	}
	r.EndReason = uint8(reason)
	r.Val.Bytes, r.Val.Packets, r.Val.TcpFlags = 1500, 3, 0x1b
	r.Ifname = "tap0"
	r.TimeStart, r.TimeEnd = 1_700_000_000_000_000, 1_700_000_001_000_000
	return r
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   capture.Record
		want schemas.Flow
	}{
		{"tx tcp v4: VM MAC is the source", rec(bpf.DirTX, 0x0800, 6, "10.0.0.5", "8.8.8.8", 40000, 443, bpf.EndFIN),
			schemas.Flow{Direction: "tx", VMMAC: "fa:16:3e:00:ab:01", PeerMAC: "fa:16:3e:00:cd:02", IPVersion: 4, Protocol: 6,
				SrcIP: "10.0.0.5", DstIP: "8.8.8.8", SrcPort: 40000, DstPort: 443, EndReason: "fin"}},
		{"rx udp v4: VM MAC is the destination", rec(bpf.DirRX, 0x0800, 17, "8.8.8.8", "10.0.0.5", 53, 5353, bpf.EndIdleTimeout),
			schemas.Flow{Direction: "rx", VMMAC: "fa:16:3e:00:ab:01", PeerMAC: "fa:16:3e:00:cd:02", IPVersion: 4, Protocol: 17,
				SrcIP: "8.8.8.8", DstIP: "10.0.0.5", SrcPort: 53, DstPort: 5353, EndReason: "idle_timeout"}},
		{"icmpv6 echo: type/code in the ports", rec(bpf.DirTX, 0x86dd, 58, "fd00::5", "2001:db8::1", 128, 0, bpf.EndShutdown),
			schemas.Flow{Direction: "tx", VMMAC: "fa:16:3e:00:ab:01", PeerMAC: "fa:16:3e:00:cd:02", IPVersion: 6, Protocol: 58,
				SrcIP: "fd00::5", DstIP: "2001:db8::1", SrcPort: 128, DstPort: 0, EndReason: "shutdown"}},
		{"overflow", rec(bpf.DirTX, 0x0800, 1, "10.0.0.5", "10.0.0.6", 8, 0, bpf.EndOverflow),
			schemas.Flow{Direction: "tx", VMMAC: "fa:16:3e:00:ab:01", PeerMAC: "fa:16:3e:00:cd:02", IPVersion: 4, Protocol: 1,
				SrcIP: "10.0.0.5", DstIP: "10.0.0.6", SrcPort: 8, EndReason: "overflow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder("node-1")
			var f schemas.Flow
			d.Decode(&tc.in, &f)
			if !f.Bin.Valid || f.VMMAC != "" || f.PeerMAC != "" || f.SrcIP != "" || f.DstIP != "" {
				t.Fatalf("decoded record is not binary-only: %+v", f)
			}
			if want := schemas.ParseDirection(tc.want.Direction); f.Bin.Dir != want {
				t.Fatalf("Bin.Dir %v, want %v", f.Bin.Dir, want)
			}
			f.FillText()
			f.Bin = schemas.FlowBin{}
			w := tc.want
			w.Node, w.Ifname, w.TCPFlags, w.Packets, w.Bytes = "node-1", "tap0", 0x1b, 3, 1500
			w.TimeStart, w.TimeEnd = 1_700_000_000_000_000, 1_700_000_001_000_000
			if f != w {
				t.Fatalf("decoded\n %+v\nwant\n %+v", f, w)
			}
			var old schemas.Flow
			newTextDecoder("node-1").Decode(&tc.in, &old)
			if f != old {
				t.Fatalf("binary decode as text\n %+v\ndiffers from the text decoder's\n %+v", f, old)
			}
		})
	}
}

func TestDecodeNoAllocs(t *testing.T) {
	d := NewDecoder("n")
	r := rec(bpf.DirTX, 0x0800, 6, "10.0.0.5", "8.8.8.8", 1, 2, bpf.EndFIN)
	var f schemas.Flow
	d.Decode(&r, &f)
	if a := testing.AllocsPerRun(1000, func() { d.Decode(&r, &f) }); a != 0 {
		t.Fatalf("%.1f allocs per decoded record, want 0", a)
	}
}

func benchRecords() []capture.Record {
	recs := make([]capture.Record, 4096)
	for i := range recs {
		recs[i] = rec(bpf.DirTX, 0x0800, 6, "10.0.0.5", "8.8.8.8", uint16(i), 443, bpf.EndIdleTimeout)
		recs[i].Key.SrcMac[5] = byte(i % 256)
		recs[i].Key.DstIp[15] = byte(i % 64)
	}
	return recs
}

// BenchmarkDecode: ns and allocations per record for a batch of records
// over 256 VMs × 64 peers, into the binary working form.
func BenchmarkDecode(b *testing.B) {
	recs := benchRecords()
	d := NewDecoder("node")
	out := make([]schemas.Flow, len(recs))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := range recs {
			d.Decode(&recs[i], &out[i])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/rec")
}

// BenchmarkDecodeText is BenchmarkDecode with the former decoder, which
// formats MACs and IPs as text (interned after the first pass): the
// baseline of the binary form.
func BenchmarkDecodeText(b *testing.B) {
	recs := benchRecords()
	d := newTextDecoder("node")
	out := make([]schemas.Flow, len(recs))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := range recs {
			d.Decode(&recs[i], &out[i])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/rec")
}
