package nodeview

import (
	"maps"
	"reflect"
	"slices"

	"github.com/tapflow/tapflow/inventory"
)

// Overlays keeps every node's overlay, encoded, from one inventory to the
// next, and rebuilds only the overlays whose inputs changed: a VM that
// boots costs its node's overlay, not all 1,010 of the fleet's. The result
// is exactly what rebuilding all of them would give, byte for byte
// (TestOverlaysIncrementalLikeFull).
//
// How: an overlay records every key (its node, an id, an address) under
// which it looked a record up. Between two inventories, changedKeys lists
// the keys of every record added, removed or changed; an overlay none of
// whose keys is listed read the same records in the same order, so it is
// the same. What is not node-local (the ids every view keeps: external
// networks, gateway and floating networks, load balancers), records
// reordered, or duplicate ids rebuild every overlay. Not safe for
// concurrent use.
type Overlays struct {
	// of the last Update's index: what the next one is compared with (not
	// the index: its maps are as large as the inventory)
	b     *Builder
	inv   *inventory.Inventory
	kept  map[string]bool
	nodes map[string]*built
}

// built is one node's overlay as last built.
type built struct {
	data []byte
	vm   bool
	err  error
	deps map[string]struct{}
}

// NewOverlays returns an empty Overlays: its first Update builds all.
func NewOverlays() *Overlays { return &Overlays{nodes: map[string]*built{}} }

// Update moves to x (an Index of the next inventory) and rebuilds the
// overlays of the nodes whose inputs changed since the last Update, a
// node new or with a failed encoding among them. It returns those nodes,
// sorted, and why every overlay was rebuilt ("" when not all were).
func (s *Overlays) Update(x *Index) (rebuilt []string, full string) {
	var keys map[string]struct{}
	switch {
	case s.inv == nil:
		full = "first inventory"
	case s.b != x.b:
		full = "another pseudonym key"
	default:
		keys, full = changedKeys(s.inv, s.kept, x)
	}
	s.b, s.inv, s.kept = x.b, x.inv, x.global.kept
	nodes := x.Nodes()
	live := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		live[n] = true
	}
	maps.DeleteFunc(s.nodes, func(n string, _ *built) bool { return !live[n] }) // no port left
	for _, n := range nodes {
		if b, ok := s.nodes[n]; full == "" && ok && b.err == nil && !touches(b.deps, keys) {
			continue
		}
		s.build(x, n)
		rebuilt = append(rebuilt, n)
	}
	return rebuilt, full
}

func (s *Overlays) build(x *Index, node string) {
	b := &built{deps: map[string]struct{}{}}
	o := x.overlay(node, func(k string) {
		if k != "" {
			b.deps[k] = struct{}{}
		}
	})
	b.vm = o.HasVM()
	b.data, b.err = Encode(o)
	s.nodes[node] = b
}

// Encoded is node's overlay as Encode gives it, whether it has a VM-like
// port (Overlay.HasVM), and the encoding's error; nil data when node has
// no port in the last Update's inventory.
func (s *Overlays) Encoded(node string) (data []byte, vm bool, err error) {
	b, ok := s.nodes[node]
	if !ok {
		return nil, false, nil
	}
	return b.data, b.vm, b.err
}

// touches reports whether deps and keys share a key.
func touches(deps, keys map[string]struct{}) bool {
	small, big := keys, deps
	if len(deps) < len(keys) {
		small, big = deps, keys
	}
	for k := range small {
		if _, ok := big[k]; ok {
			return true
		}
	}
	return false
}

// changedKeys lists the keys under which Index.overlay finds the records
// that differ between prev (with kept, the ids its views keep) and x, both versions of each: a port by its id
// and node, a trunk by its parent port, an amphora by its compute id, a
// floating IP by its port, a pool by its members' addresses and load
// balancers, anything else by its id. why is not "" when the change is
// not node-local and every overlay must be rebuilt.
func changedKeys(prev *inventory.Inventory, kept map[string]bool, x *Index) (keys map[string]struct{}, why string) {
	if !maps.Equal(kept, x.global.kept) {
		return nil, "the ids every view keeps changed (external, gateway or floating networks, load balancers)"
	}
	keys = map[string]struct{}{}
	add := func(k string) {
		if k != "" {
			keys[k] = struct{}{}
		}
	}
	p, n := prev, x.inv
	for _, w := range []string{
		diffKeys("ports", p.Ports, n.Ports, func(o *inventory.Port) string { return o.ID },
			func(o *inventory.Port, add func(string)) { add(o.ID); add(o.BindingHostID) }, add),
		diffKeys("trunks", p.Trunks, n.Trunks, func(o *inventory.Trunk) string { return o.ID },
			func(o *inventory.Trunk, add func(string)) { add(o.PortID) }, add),
		diffKeys("amphorae", p.Amphorae, n.Amphorae, func(o *inventory.Amphora) string { return o.ID },
			func(o *inventory.Amphora, add func(string)) { add(o.ComputeID) }, add),
		diffKeys("floating IPs", p.FloatingIPs, n.FloatingIPs, func(o *inventory.FloatingIP) string { return o.ID },
			func(o *inventory.FloatingIP, add func(string)) { add(o.PortID) }, add),
		diffKeys("pools", p.Pools, n.Pools, func(o *inventory.Pool) string { return o.ID },
			func(o *inventory.Pool, add func(string)) {
				for _, m := range o.Members {
					add(m.Address)
				}
				for _, r := range o.LoadBalancers {
					add(r.ID)
				}
			}, add),
		diffByID("projects", p.Projects, n.Projects, func(o *inventory.Project) string { return o.ID }, add),
		diffByID("networks", p.Networks, n.Networks, func(o *inventory.Network) string { return o.ID }, add),
		diffByID("subnets", p.Subnets, n.Subnets, func(o *inventory.Subnet) string { return o.ID }, add),
		diffByID("routers", p.Routers, n.Routers, func(o *inventory.Router) string { return o.ID }, add),
		diffByID("servers", p.Servers, n.Servers, func(o *inventory.Server) string { return o.ID }, add),
		diffByID("load balancers", p.LoadBalancers, n.LoadBalancers, func(o *inventory.LoadBalancer) string { return o.ID }, add),
	} {
		if w != "" {
			return nil, w
		}
	}
	return keys, ""
}

// diffByID is diffKeys for records looked up by their own id.
func diffByID[T any](coll string, prev, next []T, id func(*T) string, add func(string)) string {
	return diffKeys(coll, prev, next, id, func(o *T, add func(string)) { add(id(o)) }, add)
}

// diffKeys adds the keys of each record of coll added, removed or
// changed between prev and next (both versions of a changed one). It
// returns why overlays cannot be rebuilt by keys: a duplicate id (the
// index keeps one of them), or unchanged records in another order (an
// overlay lists records in inventory order).
func diffKeys[T any](coll string, prev, next []T, id func(*T) string, keysOf func(*T, func(string)), add func(string)) string {
	at := make(map[string]int, len(prev))
	for i := range prev {
		k := id(&prev[i])
		if _, dup := at[k]; dup {
			return coll + ": duplicate id " + k
		}
		at[k] = i
	}
	matched := make([]bool, len(prev))
	last := -1
	for i := range next {
		o := &next[i]
		j, ok := at[id(o)]
		if ok && matched[j] {
			return coll + ": duplicate id " + id(o)
		}
		if ok {
			matched[j] = true
			if reflect.DeepEqual(prev[j], *o) {
				if j < last {
					return coll + ": reordered"
				}
				last = j
				continue
			}
			keysOf(&prev[j], add)
		}
		keysOf(o, add)
	}
	for j := range prev {
		if !matched[j] {
			keysOf(&prev[j], add)
		}
	}
	return ""
}

// Nodes lists the nodes of the last Update, sorted.
func (s *Overlays) Nodes() []string {
	return slices.Sorted(maps.Keys(s.nodes))
}
