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
	// index is open-addressed (linear probing, at most half full): each
	// entry is a tag of the hash (high 16 bits) and 1 + the tuple's
	// position in tuples (low 16 bits); 0 is empty. No tuple is ever
	// evicted within a message.
	index  []uint32
	tuples []groupTuple
	pooled *groupTable
	// A miss costs a probe and a put on top of the per-column adds, a hit
	// saves most of them: when over three quarters of a window's records
	// are new tuples (nearly every record its own), the group turns
	// itself off for the rest of the message.
	seen, missed int
}

// groupMax is the widest group (gen.go declares them).
const groupMax = 7

// groupKey names one value of a tuple in one word: a string's address in
// the low 48 bits (user addresses fit) and its length above, or a MAC in
// the low 48 bits with groupMAC above, which no string length reaches.
// groupNone marks a value that does not fit (a string of 64 KiB or more):
// such a record always takes the per-column path.
type groupKey = uint64

const (
	groupMAC  = uint64(0xFFFF) << 48
	groupNone = ^uint64(0)
)

type groupTuple struct {
	vals [groupMax]groupKey
	keys [groupMax]int32
}

const (
	groupMinIndex = 1 << 10
	groupMaxTuple = 1 << 12 // bounds the memory; positions fit the index's low 16 bits
	groupWindow   = 1 << 10
)

// Positions must fit the index's low 16 bits.
var _ [1<<16 - 1 - groupMaxTuple]struct{}

// dictGroupsOff makes every column add its own values (tests and
// benchmarks compare the two); dictGroupsCollide gives every tuple the
// same hash, so tests see the compare alone tell tuples apart.
var dictGroupsOff, dictGroupsCollide bool

// groupTables keeps index and tuple buffers between messages.
var groupTables = sync.Pool{New: func() any { return new(groupTable) }}

type groupTable struct {
	index  []uint32
	tuples []groupTuple
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
	if t.index == nil {
		t.index = make([]uint32, groupMinIndex)
	} else {
		clear(t.index)
	}
	g.index, g.tuples, g.pooled = t.index, t.tuples[:0], t
}

// release returns the buffers to the pool.
func (g *dictGroup) release() {
	if t := g.pooled; t != nil {
		t.index, t.tuples = g.index, g.tuples[:0]
		groupTables.Put(t)
		g.pooled, g.index, g.tuples = nil, nil, nil
	}
	g.on = false
}

func (g *dictGroup) hash(v *[groupMax]groupKey) uint64 {
	if dictGroupsCollide {
		return 0
	}
	h := uint64(0)
	for i := 0; i < g.width; i++ {
		h = bits.RotateLeft64(h, 21) ^ v[i]
	}
	return h * 0x9E3779B97F4A7C15
}

// find returns the keys of tuple v, or nil when the caller must add the
// values to their columns and then call put.
func (g *dictGroup) find(v *[groupMax]groupKey) *[groupMax]int32 {
	h := g.hash(v)
	tag := uint32(h>>48) << 16
	mask := uint64(len(g.index) - 1)
	g.seen++
	for i := h >> 20 & mask; ; i = (i + 1) & mask {
		e := g.index[i]
		if e == 0 {
			break
		}
		if e&0xFFFF0000 != tag {
			continue
		}
		t := &g.tuples[e&0xFFFF-1]
		same := true
		for j := 0; j < g.width; j++ {
			if t.vals[j] != v[j] {
				same = false
				break
			}
		}
		if same {
			if g.seen >= groupWindow {
				g.window()
			}
			return &t.keys
		}
	}
	g.missed++
	if g.seen >= groupWindow {
		g.window()
	}
	return nil
}

// window closes a window of records.
func (g *dictGroup) window() {
	if 4*g.missed > 3*g.seen {
		g.on = false
	}
	g.seen, g.missed = 0, 0
}

// put remembers the keys of tuple v (after a find that returned nil).
func (g *dictGroup) put(v *[groupMax]groupKey, keys *[groupMax]int32) {
	for i := 0; i < g.width; i++ {
		if v[i] == groupNone {
			return
		}
	}
	if len(g.tuples) >= groupMaxTuple {
		return
	}
	g.tuples = append(g.tuples, groupTuple{vals: *v, keys: *keys})
	if 2*len(g.tuples) > len(g.index) {
		g.index = make([]uint32, 2*len(g.index))
		for k := range g.tuples {
			g.insert(&g.tuples[k].vals, uint32(k+1))
		}
		return
	}
	g.insert(v, uint32(len(g.tuples)))
}

func (g *dictGroup) insert(v *[groupMax]groupKey, pos uint32) {
	h := g.hash(v)
	mask := uint64(len(g.index) - 1)
	i := h >> 20 & mask
	for g.index[i] != 0 {
		i = (i + 1) & mask
	}
	g.index[i] = uint32(h>>48)<<16 | pos
}
