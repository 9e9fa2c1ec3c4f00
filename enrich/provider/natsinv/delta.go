package natsinv

import (
	"bytes"
	"cmp"
	"encoding/gob"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

// Deltas go to transport.InventoryDeltaSubject: a core NATS publish the
// agents subscribe to, sent before the full snapshot's put so that an
// agent holding the base version applies the change without downloading
// the snapshot. A delta an agent cannot apply (it holds another version,
// it missed one) is ignored: the put's announcement that follows brings
// the full snapshot. Deltas are not stored.

const hdrBase = "Tapflow-Inventory-Base"

// CurrentMsg is the note for version v read at fetched, on
// transport.InventoryCurrentSubject: the service's "version V is still
// what the cloud holds, as read at T" after each read that changed
// nothing, so that an agent's tapflow_inventory_age_seconds measures the
// time since the cloud was last read, not since it last changed.
func CurrentMsg(v uint64, fetched time.Time) *nats.Msg {
	m := nats.NewMsg(transport.InventoryCurrentSubject)
	m.Header.Set(hdrFormat, Format)
	m.Header.Set(hdrVersion, strconv.FormatUint(v, 10))
	m.Header.Set(hdrFetched, fetched.UTC().Format(time.RFC3339Nano))
	return m
}

// Changes turns one inventory into the next: whole objects added or
// changed, and the ids removed, per collection.
type Changes struct {
	Upsert inventory.Inventory
	Delete map[string][]string
}

// Len is the number of objects changed.
func (c *Changes) Len() int {
	n := 0
	for _, ids := range c.Delete {
		n += len(ids)
	}
	u := &c.Upsert
	return n + len(u.Projects) + len(u.Networks) + len(u.Subnets) + len(u.Ports) + len(u.Routers) + len(u.FloatingIPs) +
		len(u.Servers) + len(u.LoadBalancers) + len(u.Amphorae) + len(u.Pools)
}

// Sort keys (group, id): objects sharing a network or project sit
// together, so their repeated ids compress (sorted by id alone, the fleet
// snapshot grew from 12 to 17.8 MB). Two strings, not one concatenated:
// a sort of 100k ports must not allocate per comparison.
type key[T any] func(*T) (string, string)

var (
	kProject key[inventory.Project]      = func(o *inventory.Project) (string, string) { return "", o.ID }
	kNetwork key[inventory.Network]      = func(o *inventory.Network) (string, string) { return o.Project(), o.ID }
	kSubnet  key[inventory.Subnet]       = func(o *inventory.Subnet) (string, string) { return o.NetworkID, o.ID }
	kPort    key[inventory.Port]         = func(o *inventory.Port) (string, string) { return o.NetworkID, o.ID }
	kRouter  key[inventory.Router]       = func(o *inventory.Router) (string, string) { return o.Project(), o.ID }
	kFIP     key[inventory.FloatingIP]   = func(o *inventory.FloatingIP) (string, string) { return cmp.Or(o.ProjectID, o.TenantID), o.ID }
	kServer  key[inventory.Server]       = func(o *inventory.Server) (string, string) { return o.Project(), o.ID }
	kLB      key[inventory.LoadBalancer] = func(o *inventory.LoadBalancer) (string, string) { return "", o.ID }
	kAmphora key[inventory.Amphora]      = func(o *inventory.Amphora) (string, string) { return o.LoadBalancerID, o.ID }
	kPool    key[inventory.Pool]         = func(o *inventory.Pool) (string, string) { return "", o.ID }
)

func (k key[T]) cmp(a, b *T) int {
	ag, ai := k(a)
	bg, bi := k(b)
	if c := cmp.Compare(ag, bg); c != 0 {
		return c
	}
	return cmp.Compare(ai, bi)
}

func (k key[T]) id(o *T) string { _, id := k(o); return id }

// Normalize returns inv with every collection in a canonical order (a
// copy; inv is not modified), so that Apply(Diff(a, b)) is exactly b.
func Normalize(inv *inventory.Inventory) *inventory.Inventory {
	c := *inv
	c.Projects = sorted(inv.Projects, kProject)
	c.Networks = sorted(inv.Networks, kNetwork)
	c.Subnets = sorted(inv.Subnets, kSubnet)
	c.Ports = sorted(inv.Ports, kPort)
	c.Routers = sorted(inv.Routers, kRouter)
	c.FloatingIPs = sorted(inv.FloatingIPs, kFIP)
	c.Servers = sorted(inv.Servers, kServer)
	c.LoadBalancers = sorted(inv.LoadBalancers, kLB)
	c.Amphorae = sorted(inv.Amphorae, kAmphora)
	c.Pools = sorted(inv.Pools, kPool)
	return &c
}

func sorted[T any](s []T, k key[T]) []T {
	less := func(a, b T) int { return k.cmp(&a, &b) }
	if slices.IsSortedFunc(s, less) {
		return s
	}
	c := slices.Clone(s)
	slices.SortFunc(c, less)
	return c
}

// Diff computes the changes from prev to next (both normalized).
func Diff(prev, next *inventory.Inventory) *Changes {
	c := &Changes{Delete: map[string][]string{}}
	c.Upsert.Projects = diff(prev.Projects, next.Projects, kProject.id, c, "projects")
	c.Upsert.Networks = diff(prev.Networks, next.Networks, kNetwork.id, c, "networks")
	c.Upsert.Subnets = diff(prev.Subnets, next.Subnets, kSubnet.id, c, "subnets")
	c.Upsert.Ports = diff(prev.Ports, next.Ports, kPort.id, c, "ports")
	c.Upsert.Routers = diff(prev.Routers, next.Routers, kRouter.id, c, "routers")
	c.Upsert.FloatingIPs = diff(prev.FloatingIPs, next.FloatingIPs, kFIP.id, c, "floatingips")
	c.Upsert.Servers = diff(prev.Servers, next.Servers, kServer.id, c, "servers")
	c.Upsert.LoadBalancers = diff(prev.LoadBalancers, next.LoadBalancers, kLB.id, c, "loadbalancers")
	c.Upsert.Amphorae = diff(prev.Amphorae, next.Amphorae, kAmphora.id, c, "amphorae")
	c.Upsert.Pools = diff(prev.Pools, next.Pools, kPool.id, c, "pools")
	return c
}

func diff[T any](prev, next []T, id func(*T) string, c *Changes, coll string) []T {
	old := make(map[string]*T, len(prev))
	for i := range prev {
		old[id(&prev[i])] = &prev[i]
	}
	var up []T
	for i := range next {
		k := id(&next[i])
		if o, ok := old[k]; !ok || !reflect.DeepEqual(*o, next[i]) {
			up = append(up, next[i])
		}
		delete(old, k)
	}
	for k := range old {
		c.Delete[coll] = append(c.Delete[coll], k)
	}
	slices.Sort(c.Delete[coll])
	return up
}

// Apply returns base with c applied (a new, normalized inventory; base is
// not modified): base without the deleted and upserted objects, merged
// with the upserts in canonical order.
func Apply(base *inventory.Inventory, c *Changes) *inventory.Inventory {
	out := *base
	out.Projects = apply(base.Projects, c.Upsert.Projects, c.Delete["projects"], kProject)
	out.Networks = apply(base.Networks, c.Upsert.Networks, c.Delete["networks"], kNetwork)
	out.Subnets = apply(base.Subnets, c.Upsert.Subnets, c.Delete["subnets"], kSubnet)
	out.Ports = apply(base.Ports, c.Upsert.Ports, c.Delete["ports"], kPort)
	out.Routers = apply(base.Routers, c.Upsert.Routers, c.Delete["routers"], kRouter)
	out.FloatingIPs = apply(base.FloatingIPs, c.Upsert.FloatingIPs, c.Delete["floatingips"], kFIP)
	out.Servers = apply(base.Servers, c.Upsert.Servers, c.Delete["servers"], kServer)
	out.LoadBalancers = apply(base.LoadBalancers, c.Upsert.LoadBalancers, c.Delete["loadbalancers"], kLB)
	out.Amphorae = apply(base.Amphorae, c.Upsert.Amphorae, c.Delete["amphorae"], kAmphora)
	out.Pools = apply(base.Pools, c.Upsert.Pools, c.Delete["pools"], kPool)
	return &out
}

func apply[T any](base, up []T, del []string, k key[T]) []T {
	if len(up) == 0 && len(del) == 0 {
		return base
	}
	drop := make(map[string]bool, len(del)+len(up))
	for _, id := range del {
		drop[id] = true
	}
	for i := range up {
		drop[k.id(&up[i])] = true
	}
	up = sorted(up, k)
	out := make([]T, 0, len(base)+len(up))
	j := 0
	for i := range base {
		if drop[k.id(&base[i])] {
			continue
		}
		for j < len(up) && k.cmp(&up[j], &base[i]) < 0 {
			out = append(out, up[j])
			j++
		}
		out = append(out, base[i])
	}
	return append(out, up[j:]...)
}

// deltaWire is a delta's gob body. Deletions travel as a list, not as
// Changes.Delete's map: gob allocates a map's declared size before reading
// its entries (a few bytes claiming 2^28 keys stalled a decoder for
// minutes), while it checks a list's length against the bytes present.
// Its field names differ from the map form's, so a tapflow of the other
// form fails to decode it (and downloads the snapshot) rather than
// applying the upserts without the deletions.
type deltaWire struct {
	Up   inventory.Inventory
	Gone []deleted
}

type deleted struct {
	Coll string
	IDs  []string
}

// deltaColls are Changes.Delete's keys.
var deltaColls = []string{"projects", "networks", "subnets", "ports", "routers", "floatingips", "servers", "loadbalancers", "amphorae", "pools"}

// encodeDelta is a delta message: headers say which version it turns
// into which, the body is gob+zstd of the changes.
func encodeDelta(base uint64, s *Snapshot, c *Changes) (*nats.Msg, error) {
	w := deltaWire{Up: c.Upsert}
	for _, coll := range deltaColls {
		if ids := c.Delete[coll]; len(ids) > 0 {
			w.Gone = append(w.Gone, deleted{Coll: coll, IDs: ids})
		}
	}
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(&w); err != nil {
		return nil, fmt.Errorf("encode delta: %w", err)
	}
	m := nats.NewMsg(transport.InventoryDeltaSubject)
	m.Header = headers(s)
	m.Header.Set(hdrBase, strconv.FormatUint(base, 10))
	m.Data = encoder.EncodeAll(b.Bytes(), nil)
	return m, nil
}

// decodeDelta reverses encodeDelta.
func decodeDelta(m *nats.Msg) (base uint64, s Snapshot, ports int, c *Changes, err error) {
	if s, err = meta(m.Header); err != nil {
		return 0, s, 0, nil, err
	}
	if base, err = strconv.ParseUint(m.Header.Get(hdrBase), 10, 64); err != nil || base+1 != s.Version {
		return 0, s, 0, nil, fmt.Errorf("delta base %q for version %d: not the version before", m.Header.Get(hdrBase), s.Version)
	}
	if ports, err = strconv.Atoi(m.Header.Get(hdrPorts)); err != nil {
		return 0, s, 0, nil, fmt.Errorf("delta ports %q: %w", m.Header.Get(hdrPorts), err)
	}
	raw, err := decompress(m.Data)
	if err != nil {
		return 0, s, 0, nil, fmt.Errorf("decode delta: zstd: %w", err)
	}
	var w deltaWire
	if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&w); err != nil {
		return 0, s, 0, nil, fmt.Errorf("decode delta: gob: %w", err)
	}
	c = &Changes{Upsert: w.Up, Delete: make(map[string][]string, len(deltaColls))}
	for _, d := range w.Gone {
		if !slices.Contains(deltaColls, d.Coll) {
			return 0, s, 0, nil, fmt.Errorf("decode delta: deletions of unknown collection %q", d.Coll)
		}
		if _, dup := c.Delete[d.Coll]; dup {
			return 0, s, 0, nil, fmt.Errorf("decode delta: deletions of %s listed twice", d.Coll)
		}
		c.Delete[d.Coll] = d.IDs
	}
	return base, s, ports, c, nil
}

// deltaPays: a delta is sent when it is much smaller than the snapshot.
func deltaPays(delta, full int) bool { return delta < full/4 }
