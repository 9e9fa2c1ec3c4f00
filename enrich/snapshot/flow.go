package snapshot

import (
	"errors"
	"net/netip"

	"github.com/tapflow/tapflow/schemas"
)

// Errors of ParseFlow. They are sentinels, so a bad record costs no
// allocation either.
var (
	ErrBadDirection = errors.New("direction is neither tx nor rx")
	ErrBadMAC       = errors.New("vm_mac or peer_mac is not a MAC")
	ErrBadIP        = errors.New("src_ip or dst_ip is not an IP address")
)

// ParseFlow fills in from a textual record: vm_mac and peer_mac are already
// swapped; the IPs are in wire order and swapped here by direction. Empty
// IPs are left invalid (such a record can still be attributed by its MACs).
// On error in holds what parsed.
func ParseFlow(f *schemas.Flow, nowUS int64, in *Input) error {
	*in = Input{NowUS: nowUS, Dir: schemas.ParseDirection(f.Direction), Tap: f.Ifname}
	if f.VLANID > 0 && f.VLANID < 4095 {
		in.VLAN = uint16(f.VLANID)
	}
	var err error
	var ok bool
	if in.VMMAC, ok = ParseMAC(f.VMMAC); !ok {
		err = ErrBadMAC
	}
	if in.PeerMAC, ok = ParseMAC(f.PeerMAC); !ok {
		err = ErrBadMAC
	}
	src, okS := parseWireIP(f.SrcIP)
	dst, okD := parseWireIP(f.DstIP)
	if !okS || !okD {
		err = ErrBadIP
	}
	sp, dp := uint16(f.SrcPort), uint16(f.DstPort)
	if in.Dir == schemas.DirRX {
		in.LocalIP, in.RemoteIP = dst, src
		in.LocalPort, in.RemotePort = dp, sp
	} else {
		in.LocalIP, in.RemoteIP = src, dst
		in.LocalPort, in.RemotePort = sp, dp
	}
	if in.Dir == schemas.DirInvalid {
		err = ErrBadDirection
	}
	return err
}

func parseWireIP(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// Stamp writes r into the attribution columns of f.
func Stamp(f *schemas.Flow, r *Result) {
	f.TenantID = r.TenantID
	f.ServerID = r.ServerID
	f.PortID = r.PortID
	f.Zone = r.Zone.String()
	f.PeerTenantID = r.PeerTenantID
	f.ExternalNetwork = r.ExternalNetwork
	f.LBID = r.LBID
	f.LBSegment = r.LBSegment
	f.PoolID = r.PoolID
	f.MemberID = r.MemberID
	f.MetadataVersion = r.Version
}

// AttributeFlow parses f, attributes it and stamps the result into it. A
// record that does not parse is still stamped (what can be attributed from
// the parts that parsed; miss when the direction is invalid) and the error
// says what was wrong. out receives the result; it may not be nil.
func (s *Snapshot) AttributeFlow(f *schemas.Flow, nowUS int64, out *Result) error {
	var in Input
	err := ParseFlow(f, nowUS, &in)
	if err == ErrBadMAC {
		in.Dir = schemas.DirInvalid // a record whose MACs are not MACs: miss
	}
	s.Attribute(&in, out)
	Stamp(f, out)
	return err
}
