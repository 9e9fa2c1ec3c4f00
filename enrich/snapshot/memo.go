package snapshot

import "math"

// Memo makes a batch cost one snapshot lookup per distinct MAC and per
// distinct remote address range instead of one per record: a node's
// records repeat the same few dozen VM MACs, router MACs and prefixes
// thousands of times, and each uncached lookup walks a map or an interval
// table sized for the whole cloud.
//
// A Memo remembers what the snapshot's own tables said (the MAC and
// trunk-subport entries as stored, the matching prefix-table intervals),
// never a deadline check or a rule's outcome, so attribution through a
// Memo is the same function of the record as without one; the records
// still run every rule. It belongs to one snapshot at a time: used
// with another it forgets everything first. Entries are kept in small
// tables of two ways (a third key replaces the least recent), so the Memo
// never grows. A Memo is not safe for concurrent use; the zero value is
// ready.
//
// A Memo that thrashes costs more than it saves: when a node sees more
// distinct keys than the tables hold, in an order without locality, most
// lookups evict an entry and every one pays the memo's probe and fill on
// top of the snapshot's lookup. So each kind of key (MACs, prefixes) has
// a gate that counts, over a window of records, the lookups and the
// evictions; a window where evictions pass memoThrashNum/memoThrashDen
// of the lookups turns that kind's memo off, and the records go straight
// to the snapshot, as Attribute does, until a later window probes again
// (each failed probe doubling the wait, up to memoMaxBackoff; each window
// that pays halving it). The gate changes how a lookup is made, never
// its answer.
type Memo struct {
	s     *Snapshot
	n     int64 // records attributed through m
	next  int64 // n at which the first gate's window or off phase ends
	macOn bool  // the gates' current choices
	pfxOn bool
	gate  [2]memoGate             // gateMAC, gatePrefix
	mac   [memoMACSets][2]macSlot // two ways, the most recent first
	pfx   [memoPrefixes]pfxSlot
}

const (
	memoMACBits    = 11 // 2×2048 MACs and (MAC, VLAN) pairs: a hypervisor's VMs and their peers
	memoMACSets    = 1 << memoMACBits
	memoPrefixBits = 10
	memoPrefixes   = 1 << memoPrefixBits
	// A MAC key is the MAC (48 bits), a trunk-subport key MAC | VLAN<<48
	// | keyVLAN (a VLAN id has 12 bits); keyUsed marks a slot in use and
	// keyOK one whose key the snapshot's map has.
	keyVLAN = 1 << 63
	keyUsed = 1 << 62
	keyOK   = 1 << 61

	gateMAC    = 0 // MAC and trunk-subport lookups
	gatePrefix = 1 // remote address ranges
	// memoWindow records make one window of a gate: enough lookups that
	// a warm memo's share of evictions is measured, few enough that a
	// thrashing one stops soon.
	memoWindow = 256
	// A window thrashes when evictions > lookups × memoThrashNum /
	// memoThrashDen. A MAC memo over 10,000 VMs in random order evicts on
	// ~45-58% of its lookups and costs more than it saves; over 1,000 VMs
	// (random or clustered) and 10,000 clustered, 0-3% (BenchmarkAttributeMemo).
	memoThrashNum = 1
	memoThrashDen = 4
	// An off phase lasts memoWindow << backoff records; backoff starts at
	// memoMinBackoff and grows by one per failed probe up to
	// memoMaxBackoff, so a thrashing memo costs at most one window in
	// 1+2^memoMaxBackoff once it has settled (a probe every 65,536 records:
	// at 10,000 VMs in random order the probes cost 2-3% at 16,384).
	memoMinBackoff = 2
	memoMaxBackoff = 8
)

// memoGate decides, per kind of key, whether the records of the current
// window go through the memo. While on it counts the window's lookups and
// evictions; a miss that fills an empty way is not an eviction, so a cold
// memo (a new snapshot, the first records) warms up without being turned
// off.
type memoGate struct {
	end     int64 // Memo.n at which this window or off phase ends
	lookups int32
	evicts  int32
	off     bool
	backoff uint8
}

// turn ends a window or an off phase at record n and starts the next
// one.
func (g *memoGate) turn(n int64) {
	switch {
	case g.off: // the off phase is over: probe for a window
		g.off = false
	case g.lookups > 0 && g.evicts*memoThrashDen > g.lookups*memoThrashNum:
		g.off = true
		g.backoff = max(g.backoff, memoMinBackoff)
		g.end = n + memoWindow<<g.backoff
		g.backoff = min(g.backoff+1, memoMaxBackoff)
		return
	case g.backoff > 0: // it pays (or is still warming): the next failure
		// waits less; one lucky probe does not bring back short waits
		g.backoff--
	}
	g.end, g.lookups, g.evicts = n+memoWindow, 0, 0
}

type macSlot struct {
	key uint64 // the lookup key | keyUsed [| keyOK]; 0: empty
	e   macEntry
}

// pfxSlot is one lookupPrefix result and the address range [lo, hi]
// over which every table it consulted returns the same row.
type pfxSlot struct {
	used   bool
	v6     bool
	owner  uint64 // tenant<<32 | domain
	lo, hi u128
	val    int32 // index into Snapshot.vals, -1: none
}

// Reset forgets every entry (and the snapshot). Attribution with another
// snapshot than the last resets first. The gates stay as they are: they
// measure the traffic, not the snapshot.
func (m *Memo) Reset() {
	m.s = nil
	clear(m.mac[:])
	clear(m.pfx[:])
}

// use makes m serve s for one record; memos then returns the memo for
// its MAC lookups and the one for its prefix lookups: m, or nil where
// that kind's gate is off. Both inline: with the gates off a record pays
// a count and a few tests over Attribute.
func (m *Memo) use(s *Snapshot) {
	if m.n++; m.n >= m.next || m.s != s {
		m.turn(s)
	}
}

func (m *Memo) memos() (macs, prefixes *Memo) {
	if m.macOn {
		macs = m
	}
	if m.pfxOn {
		prefixes = m
	}
	return macs, prefixes
}

// turn is use's slow path: another snapshot, or a gate's window or off
// phase at its end.
func (m *Memo) turn(s *Snapshot) {
	if m.s != s {
		m.Reset()
		m.s = s
	}
	m.next = math.MaxInt64
	for i := range m.gate {
		g := &m.gate[i]
		if m.n >= g.end {
			g.turn(m.n)
		}
		m.next = min(m.next, g.end)
	}
	m.macOn, m.pfxOn = !m.gate[gateMAC].off, !m.gate[gatePrefix].off
}

func memoHash(k uint64, bits uint) uint64 { return (k * 0x9E3779B97F4A7C15) >> (64 - bits) }

// mac1 is s.macs[mac] through m.
func (m *Memo) mac1(s *Snapshot, mac uint64) (macEntry, bool) {
	set, hit := m.find(mac)
	if hit == nil {
		e, ok := s.macs[mac]
		hit = m.put(set, mac, e, ok)
	}
	return hit.e, hit.key&keyOK != 0
}

// vlan1 is s.vlans[vlanKey{mac, vlan}] through m.
func (m *Memo) vlan1(s *Snapshot, mac uint64, vlan uint16) (macEntry, bool) {
	k := mac | uint64(vlan)<<48 | keyVLAN
	set, hit := m.find(k)
	if hit == nil {
		e, ok := s.vlans[vlanKey{mac, vlan}]
		hit = m.put(set, k, e, ok)
	}
	return hit.e, hit.key&keyOK != 0
}

// find is the set of key k and its slot, nil when k is not in it. It
// counts the lookup for the gate.
func (m *Memo) find(k uint64) (*[2]macSlot, *macSlot) {
	m.gate[gateMAC].lookups++
	set := &m.mac[memoHash(k, memoMACBits)]
	k |= keyUsed
	if set[0].key&^keyOK == k {
		return set, &set[0]
	}
	if set[1].key&^keyOK == k {
		return set, &set[1]
	}
	return set, nil
}

// put makes (k, e, ok) the most recent entry of set, the other way the
// one before it, and counts an eviction when the least recent was in use.
func (m *Memo) put(set *[2]macSlot, k uint64, e macEntry, ok bool) *macSlot {
	if set[1].key != 0 {
		m.gate[gateMAC].evicts++
	}
	set[1] = set[0]
	set[0].e, set[0].key = e, k|keyUsed
	if ok {
		set[0].key |= keyOK
	}
	return &set[0]
}

// prefix1 is lookupPrefix through m.
//
// An answer is kept in the slot of the address's /16 (IPv4; IPv6: /32)
// when its range covers that whole block, else in the slot of its /24
// (IPv6: /48); both are looked at. Internet addresses mostly fall in
// large ranges, cloud subnets and host rows in small ones.
func (m *Memo) prefix1(s *Snapshot, tenant, domain uint32, k u128, v6 bool) *rowVal {
	g := &m.gate[gatePrefix]
	g.lookups++
	owner := uint64(tenant)<<32 | uint64(domain)
	coarse, fine := k.lo>>16, k.lo>>8
	if v6 {
		coarse, fine = k.hi>>32, k.hi>>16
	}
	h := owner * 0xff51afd7ed558ccd
	sc := &m.pfx[memoHash(coarse^h, memoPrefixBits)]
	if sc.holds(owner, k, v6) {
		return s.row(sc.val)
	}
	sf := &m.pfx[memoHash(fine^h^0x5bd1e995, memoPrefixBits)]
	if sf.holds(owner, k, v6) {
		return s.row(sf.val)
	}
	i, lo, hi := s.lookupPrefixRange(tenant, domain, k, v6)
	bl, bh := u128{0, k.lo &^ 0xffff}, u128{0, k.lo | 0xffff}
	if v6 {
		bl, bh = u128{k.hi &^ 0xffffffff, 0}, u128{k.hi | 0xffffffff, ^uint64(0)}
	}
	sl := sf
	if !bl.less(lo) && !hi.less(bh) { // the range covers the block
		sl = sc
	}
	if sl.used {
		g.evicts++
	}
	*sl = pfxSlot{used: true, v6: v6, owner: owner, lo: lo, hi: hi, val: i}
	return s.row(i)
}

func (p *pfxSlot) holds(owner uint64, k u128, v6 bool) bool {
	return p.used && p.owner == owner && p.v6 == v6 && !k.less(p.lo) && !p.hi.less(k)
}

func (s *Snapshot) row(i int32) *rowVal {
	if i < 0 {
		return nil
	}
	return &s.vals[i]
}
