package snapshot

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
type Memo struct {
	s   *Snapshot
	mac [memoMACSets][2]macSlot // two ways, the most recent first
	pfx [memoPrefixes]pfxSlot
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
)

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
// snapshot than the last resets first.
func (m *Memo) Reset() {
	m.s = nil
	clear(m.mac[:])
	clear(m.pfx[:])
}

// use makes m serve s.
func (m *Memo) use(s *Snapshot) {
	if m.s != s {
		m.Reset()
		m.s = s
	}
}

func memoHash(k uint64, bits uint) uint64 { return (k * 0x9E3779B97F4A7C15) >> (64 - bits) }

// mac1 is s.macs[mac] through m.
func (m *Memo) mac1(s *Snapshot, mac uint64) (macEntry, bool) {
	set, hit := m.find(mac)
	if hit == nil {
		e, ok := s.macs[mac]
		hit = put(set, mac, e, ok)
	}
	return hit.e, hit.key&keyOK != 0
}

// vlan1 is s.vlans[vlanKey{mac, vlan}] through m.
func (m *Memo) vlan1(s *Snapshot, mac uint64, vlan uint16) (macEntry, bool) {
	k := mac | uint64(vlan)<<48 | keyVLAN
	set, hit := m.find(k)
	if hit == nil {
		e, ok := s.vlans[vlanKey{mac, vlan}]
		hit = put(set, k, e, ok)
	}
	return hit.e, hit.key&keyOK != 0
}

// find is the set of key k and its slot, nil when k is not in it.
func (m *Memo) find(k uint64) (*[2]macSlot, *macSlot) {
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
// one before it.
func put(set *[2]macSlot, k uint64, e macEntry, ok bool) *macSlot {
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
