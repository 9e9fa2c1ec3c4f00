package schemas

import (
	"math/bits"
	"sync"
	"unsafe"
)

// dictGroup finds the keys of several dictionary columns whose values
// travel together at once: a VM's node, tap, MAC, tenant, server and port
// come from one inventory port; a record's zone, peer tenant, external
// network and load balancer columns from one attribution outcome. A
// message holds few such tuples, so one hash and one compare replace an
// add per column. A miss adds each value to its column as before and
// remembers the keys, so the dictionaries, the keys and the bytes on the
// wire are exactly those of per-column adds (TestDictGroupsSameBytes).
//
// A string is named by its address and length, a binary MAC by its value
// (groupKey): within one message both name the same bytes throughout, as
// dictColumn's caches already assume. The table keeps addresses, not
// pointers, so a pooled table keeps no record alive.
type dictGroup struct {
	on    bool
	width int
	gen   uint32
	slots []groupSlot
	table *groupTable // pooled; holds slots between messages
	used  int         // slots written in this message: the table grows with it
	// Evictions per window: a tuple's first miss is paid once, but when
	// tuples keep displacing each other in a full table (nearly every
	// record a new tuple) the group only adds work, and it turns itself
	// off for the rest of the message.
	seen, evicted int
}

// groupMax is the widest group (gen.go declares them).
const groupMax = 7

// groupKey names one value of a tuple in one word: a string's address in
// the low 48 bits (user addresses fit) and its length above, or a MAC in
// the low 48 bits with groupMAC above, which no string length reaches.
// groupNone marks a value that does not fit (a string of 64 KiB or more):
// the record takes the per-column path.
type groupKey = uint64

const (
	groupMAC  = uint64(0xFFFF) << 48
	groupNone = ^uint64(0)
)

type groupSlot struct {
	gen  uint32
	keys [groupMax]int32
	vals [groupMax]groupKey
}

const (
	groupMinSlots = 256
	groupMaxSlots = 1 << 13
	groupWindow   = 512
)

// dictGroupsOff makes every column add its own values (tests and
// benchmarks compare the two).
var dictGroupsOff bool

// groupTables keeps slot tables between messages; entries of another
// message have another gen.
var groupTables = sync.Pool{New: func() any { return new(groupTable) }}

type groupTable struct {
	gen   uint32
	slots []groupSlot
}

func strKey(s string) groupKey {
	p := uint64(uintptr(unsafe.Pointer(unsafe.StringData(s))))
	if p>>48 != 0 || len(s) >= 0xFFFF {
		return groupNone
	}
	return p | uint64(len(s))<<48
}

func macKey(v uint64) groupKey { return v&(1<<48-1) | groupMAC }

// reset starts a message of width-value tuples; off in the plain form,
// which has no keys.
func (g *dictGroup) reset(width int, form wireForm) {
	*g = dictGroup{on: !dictGroupsOff && form != formPlain && width <= groupMax, width: width}
	if !g.on {
		return
	}
	t := groupTables.Get().(*groupTable)
	if t.gen++; t.gen == 0 { // wrapped: old entries could look current
		clear(t.slots)
		t.gen = 1
	}
	if t.slots == nil {
		t.slots = make([]groupSlot, groupMinSlots)
	}
	g.gen, g.slots, g.table = t.gen, t.slots, t
}

// release returns the table to the pool.
func (g *dictGroup) release() {
	if g.table != nil {
		g.table.slots = g.slots
		groupTables.Put(g.table)
		g.table, g.slots = nil, nil
	}
	g.on = false
}

func (g *dictGroup) slot(v *[groupMax]groupKey) *groupSlot {
	h := uint64(0)
	for i := 0; i < g.width; i++ {
		h = bits.RotateLeft64(h, 21) ^ v[i]
	}
	h *= 0x9E3779B97F4A7C15
	return &g.slots[h>>40&uint64(len(g.slots)-1)]
}

// find returns the keys of tuple v, or nil when the caller must add the
// values to their columns and then call put.
func (g *dictGroup) find(v *[groupMax]groupKey) *[groupMax]int32 {
	s := g.slot(v)
	g.seen++
	hit := s.gen == g.gen
	for i := 0; hit && i < g.width; i++ {
		hit = s.vals[i] == v[i]
	}
	if !hit && s.gen == g.gen {
		g.evicted++
	}
	if g.seen >= groupWindow {
		g.window()
	}
	if hit {
		return &s.keys
	}
	return nil
}

// window closes a window of records: off when most missed.
func (g *dictGroup) window() {
	if 4*g.evicted > g.seen {
		g.on = false
	}
	g.seen, g.evicted = 0, 0
}

// put remembers the keys of tuple v (after a find that returned nil).
func (g *dictGroup) put(v *[groupMax]groupKey, keys *[groupMax]int32) {
	if g.used++; 2*g.used > len(g.slots) && len(g.slots) < groupMaxSlots {
		// A fresh, larger table: entries written so far are lost and
		// written again on their next miss.
		g.slots = make([]groupSlot, 2*len(g.slots))
		g.used = 1
	}
	for i := 0; i < g.width; i++ {
		if v[i] == groupNone {
			return
		}
	}
	s := g.slot(v)
	s.gen, s.vals, s.keys = g.gen, *v, *keys
}
