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

// ParseFlow fills in from a record: vm_mac and peer_mac are already
// swapped; the IPs are in wire order and swapped here by direction. A
// binary record (f.Bin.Valid, as the capture writes) is read as is, without
// parsing; a text record is parsed. Empty IPs are left invalid (such a
// record can still be attributed by its MACs). On error in holds what
// parsed.
func ParseFlow(f *schemas.Flow, nowUS int64, in *Input) error {
	if f.Bin.Valid {
		return binInput(f, nowUS, in)
	}
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
	in.setSides(src, dst, uint16(f.SrcPort), uint16(f.DstPort))
	if in.Dir == schemas.DirInvalid {
		err = ErrBadDirection
	}
	return err
}

// binInput is ParseFlow of a binary record: copies, no parsing.
func binInput(f *schemas.Flow, nowUS int64, in *Input) error {
	b := &f.Bin
	*in = Input{NowUS: nowUS, Dir: b.Dir, Tap: f.Ifname, VMMAC: b.VMMAC, PeerMAC: b.PeerMAC}
	if f.VLANID > 0 && f.VLANID < 4095 {
		in.VLAN = uint16(f.VLANID)
	}
	in.setSides(b.SrcIP.Unmap(), b.DstIP.Unmap(), uint16(f.SrcPort), uint16(f.DstPort))
	if in.Dir == schemas.DirInvalid {
		return ErrBadDirection
	}
	return nil
}

// setSides swaps the wire-order addresses and ports by in.Dir.
func (in *Input) setSides(src, dst netip.Addr, sp, dp uint16) {
	if in.Dir == schemas.DirRX {
		in.LocalIP, in.RemoteIP = dst, src
		in.LocalPort, in.RemotePort = dp, sp
	} else {
		in.LocalIP, in.RemoteIP = src, dst
		in.LocalPort, in.RemotePort = sp, dp
	}
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
	f.Bin.Zone = r.Zone
	f.PeerTenantID = r.PeerTenantID
	f.ExternalNetwork = r.ExternalNetwork
	f.LBID = r.LBID
	f.LBSegment = r.LBSegment
	f.PoolID = r.PoolID
	f.MemberID = r.MemberID
	f.LBTap = r.LBTap
	f.MetadataVersion = r.Version
}

// FlowInput is ParseFlow as attribution uses it: a record whose MACs are
// not MACs gets an invalid direction, so it is attributed as miss. The
// error says what was wrong. Keep in to attribute the record again later
// (AttributeInput) without parsing it again.
func FlowInput(f *schemas.Flow, nowUS int64, in *Input) error {
	err := ParseFlow(f, nowUS, in)
	if err == ErrBadMAC {
		in.Dir = schemas.DirInvalid // a record whose MACs are not MACs: miss
	}
	return err
}

// AttributeInput attributes in (from FlowInput of f) at nowUS and stamps
// the result into f. out may not be nil.
func (s *Snapshot) AttributeInput(f *schemas.Flow, in *Input, nowUS int64, out *Result) {
	s.AttributeInputMemo(nil, f, in, nowUS, out)
}

// AttributeInputMemo is AttributeInput through m (AttributeMemo); m nil:
// without a memo.
func (s *Snapshot) AttributeInputMemo(m *Memo, f *schemas.Flow, in *Input, nowUS int64, out *Result) {
	in.NowUS = nowUS
	var mm, pm *Memo
	if m != nil {
		m.use(s)
		mm, pm = m.memos()
	}
	s.attribute(mm, pm, in, out)
	Stamp(f, out)
}

// AttributeFlow parses f (a binary record is read without parsing),
// attributes it and stamps the result into it. A record that does not
// parse is still stamped (what can be attributed from the parts that
// parsed; miss when the direction is invalid) and the error says what was
// wrong. out receives the result; it may not be nil.
func (s *Snapshot) AttributeFlow(f *schemas.Flow, nowUS int64, out *Result) error {
	var in Input
	err := FlowInput(f, nowUS, &in)
	s.Attribute(&in, out)
	Stamp(f, out)
	return err
}
