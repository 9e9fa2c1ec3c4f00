package snapshot

import (
	"net/netip"
	"slices"
)

// u128 is an address as a 128-bit big-endian integer; IPv4 addresses use the
// low 32 bits.
type u128 struct{ hi, lo uint64 }

func (a u128) less(b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }

func (a u128) add1() (u128, bool) {
	lo := a.lo + 1
	hi := a.hi
	if lo == 0 {
		hi++
		if hi == 0 {
			return u128{}, false
		}
	}
	return u128{hi, lo}, true
}

func addrKey(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{0, uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	return u128{
		uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 | uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7]),
		uint64(b[8])<<56 | uint64(b[9])<<48 | uint64(b[10])<<40 | uint64(b[11])<<32 | uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15]),
	}
}

// sub1 is a-1; a must not be 0 (an interval start above k).
func (a u128) sub1() u128 {
	if a.lo == 0 {
		return u128{a.hi - 1, ^uint64(0)}
	}
	return u128{a.hi, a.lo - 1}
}

// prefixRange is the first and last address of p (p masked).
func prefixRange(p netip.Prefix) (start, end u128) {
	start = addrKey(p.Addr())
	bits := p.Addr().BitLen()
	host := bits - p.Bits() // host bits
	end = start
	switch {
	case host >= 128:
		end = u128{^uint64(0), ^uint64(0)}
	case host >= 64:
		end.lo = ^uint64(0)
		end.hi |= (uint64(1) << (host - 64)) - 1
	case host > 0:
		end.lo |= (uint64(1) << host) - 1
	}
	if bits == 32 {
		end.hi = 0
	}
	return start, end
}

// row is one prefix → value entry while a table is being built.
type row struct {
	p   netip.Prefix
	val int32 // index into Snapshot.vals
}

// lpm4 and lpm6 are longest-prefix-match tables flattened into sorted,
// disjoint intervals: starts[i] is the first address of interval i, vals[i]
// its value (-1: no prefix covers it). A lookup is one binary search.
type lpm4 struct {
	starts []uint32
	vals   []int32
}

type lpm6 struct {
	starts []u128
	vals   []int32
}

func (t *lpm4) lookup(k uint32) int32 {
	s := t.starts
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k < s[m] {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == 0 {
		return -1
	}
	return t.vals[lo-1]
}

func (t *lpm6) lookup(k u128) int32 {
	s := t.starts
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k.less(s[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == 0 {
		return -1
	}
	return t.vals[lo-1]
}

// lookupRange is lookup that also narrows [*l, *h] to the interval
// holding k, over which the answer is the same.
func (t *lpm4) lookupRange(k uint32, l, h *uint32) int32 {
	s := t.starts
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k < s[m] {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo > 0 && s[lo-1] > *l {
		*l = s[lo-1]
	}
	if lo < len(s) && s[lo]-1 < *h {
		*h = s[lo] - 1
	}
	if lo == 0 {
		return -1
	}
	return t.vals[lo-1]
}

// lookupRange is lookup that also narrows [*l, *h] to the interval
// holding k, over which the answer is the same.
func (t *lpm6) lookupRange(k u128, l, h *u128) int32 {
	s := t.starts
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k.less(s[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo > 0 && l.less(s[lo-1]) {
		*l = s[lo-1]
	}
	if lo < len(s) {
		if e := s[lo].sub1(); e.less(*h) {
			*h = e
		}
	}
	if lo == 0 {
		return -1
	}
	return t.vals[lo-1]
}

// flatten turns prefix rows of one family into intervals. Rows must not
// repeat a prefix (the builder resolves ties first). Prefixes are either
// nested or disjoint, so a sweep with a stack of open prefixes yields the
// longest match for every address.
func flatten(rows []row) (starts []u128, vals []int32) {
	type open struct {
		end u128
		val int32
	}
	slices.SortFunc(rows, func(a, b row) int {
		sa, _ := prefixRange(a.p)
		sb, _ := prefixRange(b.p)
		if sa != sb {
			if sa.less(sb) {
				return -1
			}
			return 1
		}
		return a.p.Bits() - b.p.Bits() // shorter (enclosing) first
	})
	emit := func(at u128, v int32) {
		n := len(starts)
		if n > 0 && starts[n-1] == at {
			vals[n-1] = v
			// merge with the previous interval if it now has the same value
			if n > 1 && vals[n-2] == v {
				starts, vals = starts[:n-1], vals[:n-1]
			}
			return
		}
		if n > 0 && vals[n-1] == v {
			return
		}
		starts, vals = append(starts, at), append(vals, v)
	}
	emit(u128{}, -1)
	var stack []open
	top := func() int32 {
		if len(stack) == 0 {
			return -1
		}
		return stack[len(stack)-1].val
	}
	closeUntil := func(before u128, all bool) {
		for len(stack) > 0 {
			o := stack[len(stack)-1]
			if !all && !o.end.less(before) {
				return
			}
			stack = stack[:len(stack)-1]
			if next, ok := o.end.add1(); ok {
				emit(next, top())
			}
		}
	}
	for _, r := range rows {
		s, e := prefixRange(r.p)
		closeUntil(s, false)
		emit(s, r.val)
		stack = append(stack, open{end: e, val: r.val})
	}
	closeUntil(u128{}, true)
	return starts, vals
}

func buildLPM4(rows []row) lpm4 {
	s, v := flatten(rows)
	t := lpm4{starts: make([]uint32, 0, len(s)), vals: make([]int32, 0, len(v))}
	for i := range s {
		if s[i].hi != 0 || s[i].lo > 1<<32-1 {
			break // past the v4 space (the interval after 255.255.255.255)
		}
		t.starts = append(t.starts, uint32(s[i].lo))
		t.vals = append(t.vals, v[i])
	}
	return t
}

func buildLPM6(rows []row) lpm6 {
	s, v := flatten(rows)
	return lpm6{starts: s, vals: v}
}
