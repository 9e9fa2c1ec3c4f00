package snapshot

import (
	"fmt"
	"slices"
)

// Changed reports whether s attributes some record differently from prev
// at nowUS, and names the first difference found ("" when none). It is
// the test of enrich's swap barrier: only a change needs the live flows
// exported and attributed against prev first.
//
// "Not changed" means s only adds to prev:
//   - every MAC prev attributes (VM-like endpoint, not expired ghost, or
//     gatewayed router interface), every trunk subport (MAC, VLAN), every
//     tap name and every pool-member address resolves in s to the same
//     endpoint — tenant, server, port, network, fallback exit, load
//     balancer, amphora addresses, port domain — or the same exit label;
//     a live port becoming a ghost is no change (it attributes the same
//     until its deadline), nor is a ghost expiring (prev no longer
//     attributes it either);
//   - every prefix table prev has (global, per tenant by name, per port
//     domain by key) maps every address to the same zone, peer and prefix
//     length in s.
//
// What s adds (new MACs, subports, taps, members, tenants, domains) is no
// change: records of those MACs were unknown under prev (and wait in late
// binding). Every prefix-table difference is a change, even a new subnet
// (it shadows the catch-all for its addresses): the test stays exact for
// tables, at the cost of a barrier per new subnet or infra address. The
// cost is one pass over the MACs and the flattened tables (no lookups per
// address): O(MACs + intervals).
func (s *Snapshot) Changed(prev *Snapshot, nowUS int64) string {
	if prev == nil || (len(prev.macs) == 0 && len(prev.vlans) == 0) {
		return "" // prev knows no VM: every record was unknown (late binding)
	}
	pd, sd := domainKeys(prev), domainKeys(s)
	for mac, pe := range prev.macs {
		ne, ok := s.macs[mac]
		if pe.label >= 0 && (!ok || ne.label < 0 || prev.labels[pe.label] != s.labels[ne.label]) {
			return fmt.Sprintf("router MAC %s: exit label changed", FormatMAC(mac))
		}
		if pe.ep == nil || (pe.deleteAt != 0 && pe.deleteAt <= nowUS) {
			continue // router only, or an expired ghost: prev attributes no VM by it
		}
		if !ok || ne.ep == nil {
			return fmt.Sprintf("MAC %s: no longer attributed", FormatMAC(mac))
		}
		if why := sameEntry(prev, s, pe, ne, pd, sd); why != "" {
			return fmt.Sprintf("MAC %s: %s", FormatMAC(mac), why)
		}
	}
	for k, pe := range prev.vlans {
		ne, ok := s.vlans[k]
		if pe.ep == nil {
			continue
		}
		if !ok || ne.ep == nil {
			return fmt.Sprintf("subport %s VLAN %d: no longer attributed", FormatMAC(k.mac), k.vlan)
		}
		if why := sameEntry(prev, s, pe, ne, pd, sd); why != "" {
			return fmt.Sprintf("subport %s VLAN %d: %s", FormatMAC(k.mac), k.vlan, why)
		}
	}
	for tap, mac := range prev.taps {
		if _, ok := prev.lookupMAC(mac, nowUS); !ok {
			continue // the tap's port is an expired ghost: it names no VM in prev
		}
		if m, ok := s.taps[tap]; !ok || m != mac {
			return fmt.Sprintf("tap %s: names another port", tap)
		}
	}
	for k, pm := range prev.members {
		if !slices.Equal(pm, s.members[k]) {
			return fmt.Sprintf("load balancer %s member %s: changed", k.lb, k.addr)
		}
	}
	if !sameTables(prev, s, prev.tables[0], s.tables[0]) {
		return "global prefix rows changed"
	}
	for i := 1; i < len(prev.tables) && i < len(prev.tenants); i++ {
		var nt tables
		if j, ok := s.tenantIdx[prev.tenants[i]]; ok && int(j) < len(s.tables) {
			nt = s.tables[j]
		}
		if !sameTables(prev, s, prev.tables[i], nt) {
			return fmt.Sprintf("prefix rows of project %s changed", prev.tenants[i])
		}
	}
	for i := 1; i < len(prev.domains); i++ {
		var nt tables
		if j, ok := s.domainIdx[pd[i]]; ok && int(j) < len(s.domains) {
			nt = s.domains[j]
		}
		if !sameTables(prev, s, prev.domains[i], nt) {
			return "prefix rows of a port domain changed"
		}
	}
	return ""
}

// domainKeys inverts domainIdx: the key of every domain index.
func domainKeys(s *Snapshot) []string {
	k := make([]string, len(s.domains)+1)
	for key, i := range s.domainIdx {
		if int(i) < len(k) {
			k[i] = key
		}
	}
	return k
}

// sameEntry compares two MAC entries by everything Attribute reads of
// them (the ghost deadline aside).
func sameEntry(prev, s *Snapshot, pe, ne macEntry, pd, sd []string) string {
	a, b := pe.ep, ne.ep
	switch {
	case a.TenantID != b.TenantID || prev.tenants[pe.tenant] != s.tenants[ne.tenant]:
		return "project changed"
	case a.ServerID != b.ServerID || a.PortID != b.PortID || a.NetworkID != b.NetworkID:
		return "port changed"
	case a.ExternalNetwork != b.ExternalNetwork:
		return "fallback exit network changed"
	case a.LBID != b.LBID || a.Amphora != b.Amphora || pe.amphora != ne.amphora ||
		!slices.Equal(a.base(), b.base()) || !slices.Equal(a.vips(), b.vips()):
		return "load balancer changed"
	case at(pd, pe.domain) != at(sd, ne.domain):
		return "port domain changed"
	}
	return ""
}

func at(keys []string, i uint32) string {
	if int(i) < len(keys) {
		return keys[i]
	}
	return ""
}

// sameTables: both families map every address to equal rows.
func sameTables(prev, s *Snapshot, a, b tables) bool {
	eq := func(i, j int32) bool {
		if i < 0 || j < 0 {
			return i < 0 && j < 0
		}
		return prev.vals[i] == s.vals[j]
	}
	return sameIntervals(a.v4.starts, a.v4.vals, b.v4.starts, b.v4.vals, func(x, y uint32) bool { return x < y }, eq) &&
		sameIntervals(a.v6.starts, a.v6.vals, b.v6.starts, b.v6.vals, u128.less, eq)
}

// sameIntervals compares two flattened tables as functions of the
// address: it walks the union of their interval starts (an address below
// a table's first start has no row).
func sameIntervals[K comparable](as []K, av []int32, bs []K, bv []int32, less func(K, K) bool, eq func(int32, int32) bool) bool {
	i, j := -1, -1 // current interval of each (-1: before the first)
	val := func(v []int32, k int) int32 {
		if k < 0 {
			return -1
		}
		return v[k]
	}
	for {
		if !eq(val(av, i), val(bv, j)) {
			return false
		}
		ni, nj := i+1 < len(as), j+1 < len(bs)
		switch {
		case !ni && !nj:
			return true
		case ni && nj && as[i+1] == bs[j+1]:
			i, j = i+1, j+1
		case ni && (!nj || less(as[i+1], bs[j+1])):
			i++
		default:
			j++
		}
	}
}
