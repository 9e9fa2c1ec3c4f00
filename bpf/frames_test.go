//go:build linux

package bpf

import (
	"encoding/binary"
	"net/netip"
)

// Frame builders for BPF_PROG_TEST_RUN. Checksums are left zero: the
// program never looks at them.

var (
	macA = [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x0a}
	macB = [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x0b}
)

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func eth(dst, src [6]byte, etype uint16, payload []byte) []byte {
	b := append(append(dst[:0:0], dst[:]...), src[:]...)
	b = append(b, be16(etype)...)
	return append(b, payload...)
}

func vlanEth(dst, src [6]byte, vid uint16, etype uint16, payload []byte) []byte {
	b := append(append(dst[:0:0], dst[:]...), src[:]...)
	b = append(b, be16(0x8100)...)
	b = append(b, be16(vid|0x2000)...) // PCP 1
	b = append(b, be16(etype)...)
	return append(b, payload...)
}

type v4opts struct {
	options []byte // multiple of 4
	fragOff uint16 // in 8-byte units
	mf      bool
	ihl     int // override (bogus IHL tests)
}

func ipv4(src, dst string, proto uint8, o v4opts, payload []byte) []byte {
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	hl := 20 + len(o.options)
	ihl := hl / 4
	if o.ihl != 0 {
		ihl = o.ihl
	}
	b := make([]byte, 20, hl+len(payload))
	b[0] = 0x40 | byte(ihl)
	binary.BigEndian.PutUint16(b[2:], uint16(hl+len(payload)))
	ff := o.fragOff & 0x1fff
	if o.mf {
		ff |= 0x2000
	}
	binary.BigEndian.PutUint16(b[6:], ff)
	b[8] = 64
	b[9] = proto
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	b = append(b, o.options...)
	return append(b, payload...)
}

func ipv6(src, dst string, nh uint8, payload []byte) []byte {
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	b := make([]byte, 40, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6] = nh
	b[7] = 64
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, payload...)
}

// ext6 is a generic IPv6 extension header (hop-by-hop, routing, dest opts)
// of (hdrlen+1)*8 bytes.
func ext6(nh uint8, hdrlen uint8, payload []byte) []byte {
	b := make([]byte, (int(hdrlen)+1)*8)
	b[0], b[1] = nh, hdrlen
	return append(b, payload...)
}

func frag6(nh uint8, offset uint16, more bool, payload []byte) []byte {
	b := make([]byte, 8)
	b[0] = nh
	v := offset << 3
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(b[2:], v)
	binary.BigEndian.PutUint32(b[4:], 0xdeadbeef)
	return append(b, payload...)
}

func ah6(nh uint8, payload []byte) []byte {
	b := make([]byte, 12) // hdrlen 1 → (1+2)*4 = 12
	b[0], b[1] = nh, 1
	return append(b, payload...)
}

func tcp(sport, dport uint16, flags uint8, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 5 << 4
	b[13] = flags
	return append(b, payload...)
}

func udp(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

func sctp(sport, dport uint16) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	return b
}

func icmp(typ, code uint8, payload []byte) []byte {
	return append([]byte{typ, code, 0, 0, 0, 1, 0, 1}, payload...)
}

func pad(n int) []byte { return make([]byte, n) }

func ip16(s string) [16]byte { return netip.MustParseAddr(s).As16() }

// ip4in6 is how the kernel stores an IPv4 address.
func ip4in6(s string) [16]byte { return netip.AddrFrom4(netip.MustParseAddr(s).As4()).As16() }
