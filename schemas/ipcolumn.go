package schemas

import (
	"math/bits"
	"net/netip"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
)

// ipColumn builds src_ip or dst_ip. A message's addresses repeat: one side
// of every record is the VM's own address, so in the dictionary form
// (formDict) each distinct address is formatted once and each row sends
// an index, a dictionary<int8|int16|int32, utf8> like the low-cardinality
// columns (subscribers read strings by value; docs/subscribers.md). A
// message where most rows bring an address of their own is sent as plain
// utf8 instead (ipPlainMin): there an index per row only adds bytes. The
// other forms send plain utf8, as agents before IP dictionaries did.
type ipColumn struct {
	plain bool         // utf8: s holds every row's text
	s     stringColumn // the rows' texts (plain), or the dictionary's values
	form  wireForm
	keys  []int32
	arena *colArena
	// tab finds a binary address's entry: open addressing, at most half
	// full, lent by the arena. Text values (records without the binary
	// form) are found through text.
	tab  []ipSlot
	text map[string]int32
	last ipSlot // the last binary address and its key
	n    int    // the message's rows
}

// ipSlot is one address's entry: its 16 bytes, its kind (0 an empty slot)
// and its key.
type ipSlot struct {
	hi, lo uint64
	k      int32
	kind   uint8
}

const (
	ipKindNone = 1 + iota // the zero Addr: the empty text
	ipKind4
	ipKind6
)

// ipPlain is the rule for plain utf8: past ipPlainMin distinct values,
// more than three in four rows a value of their own.
const ipPlainMin = 1 << 10

func (c *ipColumn) reset(n int, form wireForm, a *colArena) {
	*c = ipColumn{form: form, arena: a, plain: form != formDict, n: n}
	if c.plain {
		c.s.resetIn(a, n, 16)
		return
	}
	c.keys = a.int32s(n)[:0]
	c.s.resetIn(a, n, 16) // the arena's buffers: no growth within a message
	c.tab = a.ipTable(2 * ipPlainMin)
}

func ipSlotOf(v netip.Addr) ipSlot {
	switch {
	case v.Is4():
		b := v.As4()
		return ipSlot{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3]), kind: ipKind4}
	case v.IsValid():
		b := v.As16()
		return ipSlot{hi: beUint64(b[:8]), lo: beUint64(b[8:]), kind: ipKind6}
	}
	return ipSlot{kind: ipKindNone}
}

// slot is where the address's probe starts in a table of size slots (a
// power of two).
func (sl *ipSlot) slot(size int) uint64 {
	h := (sl.hi ^ bits.RotateLeft64(sl.lo, 29) ^ uint64(sl.kind)) * 0x9E3779B97F4A7C15
	return h >> (64 - bits.TrailingZeros(uint(size)))
}

func beUint64(b []byte) uint64 {
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// addIP appends a binary address (FlowBin form).
func (c *ipColumn) addIP(v netip.Addr) {
	if c.plain {
		c.s.addIP(v)
		return
	}
	if v.Zone() != "" { // never captured; kept exact through the text path
		c.add(v.String())
		return
	}
	key := ipSlotOf(v)
	if key.kind == c.last.kind && key.hi == c.last.hi && key.lo == c.last.lo {
		c.keys = append(c.keys, c.last.k)
		return
	}
	mask := uint64(len(c.tab) - 1)
	for i := key.slot(len(c.tab)); ; i = (i + 1) & mask {
		sl := &c.tab[i]
		if sl.kind == 0 { // a new entry
			key.k = int32(len(c.s.offsets) - 1)
			*sl = key
			c.s.addIP(v)
			c.last = key
			c.keys = append(c.keys, key.k)
			c.grown()
			return
		}
		if sl.kind == key.kind && sl.hi == key.hi && sl.lo == key.lo {
			c.last = *sl
			c.keys = append(c.keys, sl.k)
			return
		}
	}
}

// add appends a text value (records without the binary form).
func (c *ipColumn) add(v string) {
	if c.plain {
		c.s.add(v)
		return
	}
	k, ok := c.text[v]
	if !ok {
		if c.text == nil {
			c.text = make(map[string]int32)
		}
		k = int32(len(c.s.offsets) - 1)
		c.s.add(v)
		c.text[string(c.s.data[len(c.s.data)-len(v):])] = k
	}
	c.keys = append(c.keys, k)
	if !ok {
		c.grown()
	}
}

// grown follows a new dictionary entry: the table doubles past half full;
// the column turns plain when the entries outgrow the rule.
func (c *ipColumn) grown() {
	m := len(c.s.offsets) - 1
	if m > ipPlainMin && 4*m > 3*len(c.keys) {
		c.toPlain()
		return
	}
	if 2*m <= len(c.tab) {
		return
	}
	old := c.tab
	c.tab = c.arena.ipTable(2 * len(old))
	mask := uint64(len(c.tab) - 1)
	for _, sl := range old {
		if sl.kind == 0 {
			continue
		}
		i := sl.slot(len(c.tab))
		for c.tab[i].kind != 0 {
			i = (i + 1) & mask
		}
		c.tab[i] = sl
	}
}

// toPlain writes the rows so far as text and sends the rest so.
func (c *ipColumn) toPlain() {
	dict := c.s
	var p stringColumn
	p.resetIn(c.arena, c.n, 16)
	base := dict.offsets[0]
	for _, k := range c.keys {
		p.data = append(p.data, dict.data[dict.offsets[k]-base:dict.offsets[k+1]-base]...)
		p.offsets = append(p.offsets, int32(len(p.data)))
	}
	dict.arena.keep(dict.slot, dict.data)
	c.s, c.plain, c.tab, c.text = p, true, nil, nil
}

func (c *ipColumn) column() wireColumn {
	if c.plain {
		return c.s.column()
	}
	c.s.arena.keep(c.s.slot, c.s.data)
	m := len(c.s.offsets) - 1
	dt, keys := narrowKeys(c.keys, m, c.form)
	return wireColumn{typ: dt, n: len(c.keys), vals: keys, offs: arrow.Int32Traits.CastToBytes(c.s.offsets), data: c.s.data, dictLen: m}
}

// narrowKeys is the dictionary type and index array of keys into m
// values: narrowed in place (each index is read before its bytes are
// written over) to the narrowest type that holds the dictionary
// (formDict).
func narrowKeys(keys []int32, m int, form wireForm) (*arrow.DictionaryType, []byte) {
	n := len(keys)
	if form == formWide || n == 0 || m > 1<<15 {
		return wireDictType, arrow.Int32Traits.CastToBytes(keys)
	}
	p := unsafe.Pointer(unsafe.SliceData(keys))
	if m <= 1<<7 {
		v := unsafe.Slice((*int8)(p), n)
		for i, k := range keys {
			v[i] = int8(k)
		}
		return dictInt8, arrow.Int8Traits.CastToBytes(v)
	}
	v := unsafe.Slice((*int16)(p), n)
	for i, k := range keys {
		v[i] = int16(k)
	}
	return dictInt16, arrow.Int16Traits.CastToBytes(v)
}
