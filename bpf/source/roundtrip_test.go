package source

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
)

func mac6(t testing.TB, s string) [6]byte {
	t.Helper()
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		t.Fatalf("bad MAC %q: %v", s, err)
	}
	return [6]byte(hw)
}

// ringRec is a kernel record on the wire: src/dst MACs and IPs in wire
// order (the VM is the source on tx, the destination on rx).
func ringRec(t testing.TB, dir bpf.Direction, ethProto uint16, vlan uint16, srcMAC, dstMAC, src, dst string, proto uint8, sp, dp uint16) capture.Record {
	t.Helper()
	var r capture.Record
	k := &r.Key
	k.Ifindex, k.Direction, k.EthProto, k.Protocol, k.SrcPort, k.DstPort, k.VlanId = 7, uint8(dir), ethProto, proto, sp, dp, vlan
	k.SrcMac, k.DstMac = mac6(t, srcMAC), mac6(t, dstMAC)
	k.SrcIp, k.DstIp = netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	r.EndReason = uint8(bpf.EndActiveTimeout)
	r.Val.Bytes, r.Val.Packets, r.Val.TcpFlags = 4242, 7, 0x12
	r.Ifname = "tapvm-0-0"
	r.TimeStart, r.TimeEnd = 1_700_000_000_000_000, 1_700_000_001_000_000
	return r
}

// TestBinaryRoundTrip: ring record → decode → attribute (enrich.Engine,
// late binding on) → wire encode → wire decode gives, column for column,
// what the former text path (text decoder, parsed back by attribution)
// gives, and no MAC or IP column is ever empty on the wire.
func TestBinaryRoundTrip(t *testing.T) {
	inv := synth.Generate(synth.Options{Tenants: 3, VMsPerTenant: 4, LoadBalancers: 1, WithIPv6: true, ExternalNetworks: 1})
	vm, vm2, router := synth.VMMAC(0, 0), synth.VMMAC(0, 2), synth.RouterMAC(0, 0)
	vmIP, vm2IP := synth.VMIP(0, 0), synth.VMIP(0, 2)
	const unknown = "fa:16:3e:ff:ee:01"
	cut := ringRec(t, bpf.DirTX, 0x0800, 0, vm, router, "0.0.0.0", "0.0.0.0", 6, 1, 2)
	cut.Key.SrcIp, cut.Key.DstIp = [16]byte{1, 2, 3}, [16]byte{} // IPv4 header cut short: not v4-mapped
	for _, tc := range []struct {
		name       string
		rec        capture.Record
		zone, tent string
	}{
		{"v4 tx to the internet", ringRec(t, bpf.DirTX, 0x0800, 0, vm, router, vmIP, "8.8.8.8", 6, 40000, 443), "external", synth.Project(0)},
		{"v4 rx L2 same tenant", ringRec(t, bpf.DirRX, 0x0800, 0, vm2, vm, vm2IP, vmIP, 17, 5000, 53), "same_tenant", synth.Project(0)},
		{"v6 tx", ringRec(t, bpf.DirTX, 0x86dd, 0, vm, router, "fd00:0:0::10", "2001:db8::1", 58, 128, 0), "external", synth.Project(0)},
		{"v6 with a v4-mapped address", ringRec(t, bpf.DirRX, 0x86dd, 0, router, vm, "::ffff:192.0.2.7", "fd00::5", 17, 1, 2), "", synth.Project(0)},
		{"vlan-tagged v4", ringRec(t, bpf.DirTX, 0x0800, 100, vm, router, vmIP, "1.1.1.1", 17, 999, 53), "", ""},
		{"multicast tx", ringRec(t, bpf.DirTX, 0x0800, 0, vm, "01:00:5e:00:00:fb", vmIP, "224.0.0.251", 17, 5353, 5353), "multicast", synth.Project(0)},
		{"multicast rx: the VM-side MAC is the group", ringRec(t, bpf.DirRX, 0x0800, 0, vm2, "01:00:5e:00:00:fb", vm2IP, "224.0.0.251", 17, 5353, 5353), "multicast", ""},
		{"unknown VM MAC (held, released at shutdown)", ringRec(t, bpf.DirTX, 0x0800, 0, unknown, router, "10.9.9.9", "8.8.4.4", 6, 1234, 80), "miss", schemas.UnknownTenant},
		{"IPv4 header cut short", cut, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := []capture.Record{tc.rec, ringRec(t, bpf.DirTX, 0x0800, 0, vm, router, vmIP, "9.9.9.9", 6, 1, 443)}
			var asked []string
			run := func(decode func(*capture.Record, *schemas.Flow)) []schemas.Flow {
				e, err := enrich.New(enrich.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry(),
					enrich.WithProvider(synthetic.NewStaticProvider(inv)), enrich.WithUnknownVM(func(m string) { asked = append(asked, m) }))
				if err != nil {
					t.Fatal(err)
				}
				if err := e.Load(context.Background()); err != nil {
					t.Fatal(err)
				}
				flows := make([]schemas.Flow, len(recs))
				for i := range recs {
					decode(&recs[i], &flows[i])
				}
				b := pipeline.NewBatch(flows, nil)
				ctx, cancel := context.WithCancel(context.Background())
				if err := e.Apply(ctx, b); err != nil {
					t.Fatal(err)
				}
				cancel()
				last := pipeline.NewBatch(nil, nil)
				if err := e.Apply(ctx, last); err != nil { // shutdown: held records come out
					t.Fatal(err)
				}
				b.Records = append(b.Records, last.Records...)
				for i := range b.Records {
					b.Records[i].AgentID, b.Records[i].BatchSeq, b.Records[i].RecordIndex = "agent", 9, int32(i)
				}
				enc, err := schemas.NewEncoder(schemas.CodecLZ4)
				if err != nil {
					t.Fatal(err)
				}
				body, err := enc.Encode(nil, b.Records)
				if err != nil {
					t.Fatal(err)
				}
				out, err := schemas.NewDecoder().Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			old := run(newTextDecoder("node-1").Decode)
			oldAsked := asked
			asked = nil
			got := run(NewDecoder("node-1").Decode)
			if len(got) != len(recs) || len(old) != len(recs) {
				t.Fatalf("records out: binary %d, text %d, want %d", len(got), len(old), len(recs))
			}
			for i := range got {
				if got[i] != old[i] {
					t.Errorf("record %d on the wire\n binary path %+v\n text path   %+v", i, got[i], old[i])
				}
				g := &got[i]
				if g.VMMAC == "" || g.PeerMAC == "" || g.SrcIP == "" || g.DstIP == "" || g.Zone == "" || g.TenantID == "" {
					t.Errorf("record %d has an empty address or attribution column on the wire: %+v", i, *g)
				}
			}
			var f *schemas.Flow // the case's record (a held one comes out last)
			for i := range got {
				if got[i].SrcPort == int32(tc.rec.Key.SrcPort) && got[i].DstPort == int32(tc.rec.Key.DstPort) {
					f = &got[i]
				}
			}
			if f == nil {
				t.Fatalf("the case's record is not among %+v", got)
			}
			if tc.zone != "" && f.Zone != tc.zone {
				t.Errorf("zone %s, want %s", f.Zone, tc.zone)
			}
			if tc.tent != "" && f.TenantID != tc.tent {
				t.Errorf("tenant %s, want %s", f.TenantID, tc.tent)
			}
			if len(asked) != len(oldAsked) || (len(asked) > 0 && asked[0] != oldAsked[0]) {
				t.Errorf("unknown-VM lookups: binary path %q, text path %q", asked, oldAsked)
			}
		})
	}
}
