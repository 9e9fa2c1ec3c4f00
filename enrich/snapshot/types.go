package snapshot

import (
	"net/netip"

	"github.com/tapflow/tapflow/schemas"
)

// Input is one record as the hot path sees it: parsed, after the
// directional swap. Build it with [Swap] from wire-order values, or fill it
// directly when the capture stage already knows which side is the VM.
type Input struct {
	Dir schemas.Direction
	// VMMAC is the MAC on the VM side of the tap, PeerMAC the far side, as
	// returned by [ParseMAC]: the six octets big-endian in the low 48 bits.
	VMMAC, PeerMAC uint64
	// LocalIP is the VM-side address, RemoteIP the far end's.
	LocalIP, RemoteIP netip.Addr
	// LocalPort and RemotePort are the L4 ports on those sides (0: none);
	// they tell apart pool members that share an address.
	LocalPort, RemotePort uint16
	// VLAN is the frame's 802.1Q VLAN id on the tap (0: untagged): a trunk
	// subport is found by (VM MAC, VLAN).
	VLAN uint16
	// NowUS is the attribution clock (µs since the Unix epoch) against
	// which ghost deadlines are checked.
	NowUS int64
	// Tap is the capture interface (tap<port-id[:11]>, as Nova names it).
	// It names the VM when its MAC cannot: on received multicast the
	// VM-side MAC is the group address. "" when unknown.
	Tap string
}

// Swap fills the MAC and IP fields of in from wire order: on tx the VM is
// the source, on rx the destination (domain reference §1.3 step 6).
func (in *Input) Swap(dir schemas.Direction, srcMAC, dstMAC uint64, srcIP, dstIP netip.Addr) {
	in.Dir = dir
	if dir == schemas.DirRX {
		in.VMMAC, in.PeerMAC, in.LocalIP, in.RemoteIP = dstMAC, srcMAC, dstIP, srcIP
		return
	}
	in.VMMAC, in.PeerMAC, in.LocalIP, in.RemoteIP = srcMAC, dstMAC, srcIP, dstIP
}

// DstMAC is the destination MAC on the wire, undoing the swap.
func (in *Input) DstMAC() uint64 {
	if in.Dir == schemas.DirRX {
		return in.VMMAC
	}
	return in.PeerMAC
}

// Result is the attribution of one record. Strings point into the
// snapshot; copying them does not allocate.
type Result struct {
	TenantID        string // project of the VM (the LB owner for amphorae), or [schemas.UnknownTenant]
	ServerID        string // Nova instance (port device_id), '' when unknown
	PortID          string // Neutron port, '' when unknown
	PeerTenantID    string // tenant of the far end when known, else ''
	ExternalNetwork string // exit network label on external records, else [schemas.NoExternalNetwork]
	LBID            string // load balancer when the tap is an amphora's or on a member's segment 2, else ''
	PoolID          string // pool of the member on segment 2, else ''
	MemberID        string // pool member on segment 2, else ''
	LBTap           string // with LBID: [schemas.LBTapAmphora] at the amphora's tap, [schemas.LBTapMember] on a member's segment 2; else ''
	Zone            schemas.Zone
	LBSegment       int32 // 1 client ↔ VIP, 2 amphora base ↔ member, 0 otherwise
	Version         int64 // snapshot version
	// UnknownVM is true when the VM-side MAC is not in the snapshot (zone
	// miss): the record is a late-binding candidate.
	UnknownVM bool
}

// ParseMAC reads "aa:bb:cc:dd:ee:ff" (or with '-', any case) without
// allocating ([schemas.ParseMAC]).
func ParseMAC(s string) (uint64, bool) { return schemas.ParseMAC(s) }

// MACFromBytes packs six octets as ParseMAC does ([schemas.MACFrom6]).
func MACFromBytes(b [6]byte) uint64 { return schemas.MACFrom6(b) }

// FormatMAC is the lowercase colon form of a packed MAC ([schemas.FormatMAC]).
func FormatMAC(v uint64) string { return schemas.FormatMAC(v) }

// IsGroupMAC reports whether the I/G bit (multicast/broadcast) is set.
func IsGroupMAC(v uint64) bool { return (v>>40)&1 == 1 }
