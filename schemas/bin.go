package schemas

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
)

// FlowBin is a flow record's binary working form: the capture fills it
// instead of the MAC and IP text, attribution reads it without parsing, and
// the wire encoder (encodeFlowColumns) formats the text once, straight into
// the Arrow column buffers. It is no column: Parquet and JSON skip it, and
// the wire and Parquet schemas are unchanged.
//
// When Valid, VMMAC, PeerMAC, SrcIP and DstIP hold the record's addresses
// and the Flow's text fields of the same name are not read (they may be
// empty); read them through [Flow.VMMACText] and its siblings, or call
// [Flow.FillText] before handing the record to code that reads the struct
// (encoding/json, reflection). Direction and zone text stay set on every
// record (static strings, free to copy); Dir and Zone mirror them as enums.
// A zero FlowBin (Valid false) is a text record, as every producer other
// than the capture and the synthetic source writes.
type FlowBin struct {
	// VMMAC and PeerMAC are the MACs after the directional swap, six
	// octets big-endian in the low 48 bits (snapshot.ParseMAC's form).
	VMMAC, PeerMAC uint64
	// SrcIP and DstIP are in wire order; IPv4 unmapped. The zero Addr is
	// the empty text.
	SrcIP, DstIP netip.Addr
	Dir          Direction
	// Zone is the attribution's zone (set with the Zone column).
	Zone  Zone
	Valid bool
}

// ParseMAC reads "aa:bb:cc:dd:ee:ff" (or with '-', any case) without
// allocating.
func ParseMAC(s string) (uint64, bool) {
	if len(s) != 17 {
		return 0, false
	}
	var v uint64
	for i := 0; i < 17; i++ {
		c := s[i]
		if i%3 == 2 {
			if c != ':' && c != '-' {
				return 0, false
			}
			continue
		}
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, true
}

// MACFrom6 packs six octets as FlowBin holds them.
func MACFrom6(b [6]byte) uint64 {
	return uint64(b[0])<<40 | uint64(b[1])<<32 | uint64(b[2])<<24 | uint64(b[3])<<16 | uint64(b[4])<<8 | uint64(b[5])
}

const hexDigits = "0123456789abcdef"

// AppendMAC appends the lowercase colon form of a packed MAC.
func AppendMAC(dst []byte, v uint64) []byte {
	var b [17]byte
	for i := 0; i < 6; i++ {
		o := byte(v >> (40 - 8*i))
		b[i*3], b[i*3+1] = hexDigits[o>>4], hexDigits[o&15]
		if i < 5 {
			b[i*3+2] = ':'
		}
	}
	return append(dst, b[:]...)
}

// FormatMAC is the lowercase colon form of a packed MAC.
func FormatMAC(v uint64) string { return string(AppendMAC(make([]byte, 0, 17), v)) }

func ipText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// VMMACText is vm_mac as text (formatted, so allocating, for a binary record).
func (f *Flow) VMMACText() string {
	if f.Bin.Valid {
		return FormatMAC(f.Bin.VMMAC)
	}
	return f.VMMAC
}

// PeerMACText is peer_mac as text.
func (f *Flow) PeerMACText() string {
	if f.Bin.Valid {
		return FormatMAC(f.Bin.PeerMAC)
	}
	return f.PeerMAC
}

// SrcIPText is src_ip as text.
func (f *Flow) SrcIPText() string {
	if f.Bin.Valid {
		return ipText(f.Bin.SrcIP)
	}
	return f.SrcIP
}

// DstIPText is dst_ip as text.
func (f *Flow) DstIPText() string {
	if f.Bin.Valid {
		return ipText(f.Bin.DstIP)
	}
	return f.DstIP
}

// FillText writes the text of a binary record's addresses into its empty
// text fields (allocating), for consumers that read the struct itself
// (encoding/json, reflection); the record stays binary. Text already there
// is kept: a producer writing both (the synthetic source) keeps them
// equal. A text record is left alone.
func (f *Flow) FillText() {
	if !f.Bin.Valid {
		return
	}
	if f.VMMAC == "" {
		f.VMMAC = FormatMAC(f.Bin.VMMAC)
	}
	if f.PeerMAC == "" {
		f.PeerMAC = FormatMAC(f.Bin.PeerMAC)
	}
	if f.SrcIP == "" {
		f.SrcIP = ipText(f.Bin.SrcIP)
	}
	if f.DstIP == "" {
		f.DstIP = ipText(f.Bin.DstIP)
	}
}

// addMAC appends a packed MAC's text as one value, allocating nothing
// once the buffer has grown.
func (s *stringColumn) addMAC(v uint64) {
	s.data = AppendMAC(s.data, v)
	s.offsets = append(s.offsets, int32(len(s.data)))
}

// addIP appends an address's text as one value ("" for the zero Addr).
func (s *stringColumn) addIP(a netip.Addr) {
	if a.Is4() {
		s.data = appendIPv4(s.data, a.As4())
	} else if a.IsValid() {
		s.data = a.AppendTo(s.data)
	}
	s.offsets = append(s.offsets, int32(len(s.data)))
}

// octetDot is each octet's decimal text followed by '.', little-endian in
// a word, and octetLen its length with the dot: appendIPv4 stores whole
// words instead of dividing, four per address.
var octetDot, octetLen = func() (w [256]uint32, n [256]uint8) {
	for i := range 256 {
		t := strconv.Itoa(i) + "."
		var b [4]byte
		copy(b[:], t)
		w[i], n[i] = binary.LittleEndian.Uint32(b[:]), uint8(len(t))
	}
	return w, n
}()

// appendIPv4 appends the dotted-decimal text of a, as netip.Addr.AppendTo
// writes an IPv4 address.
// The words land in dst's spare capacity (16 bytes reserved; what lies
// past the text is cut off), so nothing is copied twice.
func appendIPv4(dst []byte, a [4]byte) []byte {
	l := len(dst)
	dst = slices.Grow(dst, 16)
	w := dst[l : l+16]
	n := 0
	for _, o := range a {
		binary.LittleEndian.PutUint32(w[n:], octetDot[o]) // n ≤ 12
		n += int(octetLen[o])
	}
	return dst[:l+n-1]
}
