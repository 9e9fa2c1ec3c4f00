package source

import (
	"net/netip"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/schemas"
)

// Decoder turns kernel records into flow.v1 records in their binary form
// (schemas.FlowBin): MACs and IPs are copied as numbers, never formatted;
// the wire encoder writes their text once. Decoding allocates nothing. Not
// safe for concurrent use.
type Decoder struct {
	node string
}

// NewDecoder returns a decoder that writes node into every record.
func NewDecoder(node string) *Decoder { return &Decoder{node: node} }

var endReasons = func() [8]string {
	var a [8]string
	for _, r := range bpf.EndReasons() {
		a[r] = r.String()
	}
	return a
}()

// Decode fills f from r. Enrichment columns are left untouched; the MAC
// and IP text fields are left empty (f.Bin holds them).
func (d *Decoder) Decode(r *capture.Record, f *schemas.Flow) {
	k := &r.Key
	f.TimeStart, f.TimeEnd = r.TimeStart, r.TimeEnd
	f.Node = d.node
	f.Ifname = r.Ifname
	f.VMMAC, f.PeerMAC, f.SrcIP, f.DstIP = "", "", "", ""
	b := &f.Bin
	b.Valid = true
	if bpf.Direction(k.Direction) == bpf.DirRX {
		f.Direction, b.Dir = "rx", schemas.DirRX
		b.VMMAC, b.PeerMAC = schemas.MACFrom6(k.DstMac), schemas.MACFrom6(k.SrcMac)
	} else {
		f.Direction, b.Dir = "tx", schemas.DirTX
		b.VMMAC, b.PeerMAC = schemas.MACFrom6(k.SrcMac), schemas.MACFrom6(k.DstMac)
	}
	f.VLANID = int32(k.VlanId)
	if k.EthProto == 0x86dd {
		f.IPVersion = 6
		b.SrcIP, b.DstIP = netip.AddrFrom16(k.SrcIp), netip.AddrFrom16(k.DstIp)
	} else {
		f.IPVersion = 4
		b.SrcIP, b.DstIP = ip4(&k.SrcIp), ip4(&k.DstIp)
	}
	f.Protocol = int32(k.Protocol)
	f.SrcPort, f.DstPort = int32(k.SrcPort), int32(k.DstPort)
	f.TCPFlags = int32(r.Val.TcpFlags & 0xff)
	f.Packets, f.Bytes = int64(r.Val.Packets), int64(r.Val.Bytes)
	if int(r.EndReason) < len(endReasons) {
		f.EndReason = endReasons[r.EndReason]
	} else {
		f.EndReason = bpf.EndReason(r.EndReason).String()
	}
}

// ip4 is the IPv4 address the kernel stores v4-mapped; an address that is
// not (IP header cut short) reads as 0.0.0.0, as the text form always did.
func ip4(a *[16]byte) netip.Addr {
	if a[10] != 0xff || a[11] != 0xff || [10]byte(a[:10]) != [10]byte{} {
		return netip.IPv4Unspecified()
	}
	return netip.AddrFrom4([4]byte(a[12:16]))
}
