package source

import (
	"net/netip"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/schemas"
)

// cacheMax bounds each intern table of textDecoder; emptied when full.
const cacheMax = 1 << 16

// textDecoder is the decoder before the binary working record (kept as
// the baseline of BenchmarkDecode and the reference of the round-trip
// test): it formats MACs and IPs as text, interning them.
type textDecoder struct {
	node string
	macs map[[6]byte]string
	ips  map[[16]byte]string
}

func newTextDecoder(node string) *textDecoder {
	return &textDecoder{node: node, macs: map[[6]byte]string{}, ips: map[[16]byte]string{}}
}

// Decode fills f from r. Enrichment columns are left untouched.
func (d *textDecoder) Decode(r *capture.Record, f *schemas.Flow) {
	k := &r.Key
	f.TimeStart, f.TimeEnd = r.TimeStart, r.TimeEnd
	f.Node = d.node
	f.Ifname = r.Ifname
	if bpf.Direction(k.Direction) == bpf.DirRX {
		f.Direction = "rx"
		f.VMMAC, f.PeerMAC = d.mac(k.DstMac), d.mac(k.SrcMac)
	} else {
		f.Direction = "tx"
		f.VMMAC, f.PeerMAC = d.mac(k.SrcMac), d.mac(k.DstMac)
	}
	f.VLANID = int32(k.VlanId)
	if k.EthProto == 0x86dd {
		f.IPVersion = 6
	} else {
		f.IPVersion = 4
	}
	f.SrcIP, f.DstIP = d.ip(&k.SrcIp, f.IPVersion), d.ip(&k.DstIp, f.IPVersion)
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

const textHexDigits = "0123456789abcdef"

func (d *textDecoder) mac(m [6]byte) string {
	if s, ok := d.macs[m]; ok {
		return s
	}
	var b [17]byte
	for i, v := range m {
		if i > 0 {
			b[i*3-1] = ':'
		}
		b[i*3], b[i*3+1] = textHexDigits[v>>4], textHexDigits[v&0xf]
	}
	s := string(b[:])
	if len(d.macs) >= cacheMax {
		clear(d.macs)
	}
	d.macs[m] = s
	return s
}

func (d *textDecoder) ip(a *[16]byte, version int32) string {
	if s, ok := d.ips[*a]; ok {
		return s
	}
	addr := netip.AddrFrom16(*a)
	if version == 4 {
		if addr.Is4In6() {
			addr = addr.Unmap()
		} else {
			addr = netip.IPv4Unspecified() // IP header cut short
		}
	}
	s := addr.String()
	if len(d.ips) >= cacheMax {
		clear(d.ips)
	}
	d.ips[*a] = s
	return s
}
