// Package nodeview narrows what an agent is given of the inventory to what
// attributing its own node's records needs (inventory.scope: node;
// docs/security.md, "What an agent sees").
//
// An agent attributes both ends of a flow, so it cannot do with its own
// ports only: the remote end (another tenant's VM elsewhere, a router, an
// amphora) is attributed from that port's MAC, addresses and project, the
// subnets, routers and routes around it, and the load balancers. A view
// keeps, for every port bound to the node (binding:host_id), the whole
// record and what it refers to (its server, project, floating IPs, trunks),
// and for every other object only the fields attribution reads, with
// identifiers replaced by keyed pseudonyms (HMAC-SHA-256) that keep the
// references between objects and reveal nothing else, and without names,
// hosts, servers, other tenants' floating IPs and pool members not on
// the node.
//
// Exactness: for a record whose VM-side port is bound to the node,
// snapshot.Build of the view attributes exactly as snapshot.Build of the
// whole inventory, field by field (TestViewAttributesLikeFull). Two
// inventories that differ only in what a view drops give equal views, so
// a change elsewhere in the cloud that does not touch what the node needs
// leaves its view unchanged.
package nodeview

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/tapflow/tapflow/inventory"
)

// MinKeyLen is the shortest pseudonym key accepted: 128 bits.
const MinKeyLen = 16

// vmOwner is the device_owner every VM-like port gets in a view when it is
// not the node's: the owner's suffix (compute:<availability zone>) says
// where the VM runs, and attribution only asks whether it is network:*.
const vmOwner = "compute:"

// Builder makes views. Safe for concurrent use.
type Builder struct {
	key []byte
}

// New returns a Builder whose pseudonyms are keyed with key (at least
// MinKeyLen bytes): without it an agent that knows a port's id cannot
// find it in a view. The service keeps one key for its lifetime so that a
// view changes only when what it holds changes.
func New(key []byte) (*Builder, error) {
	if len(key) < MinKeyLen {
		return nil, errors.New("nodeview: the pseudonym key must have at least 16 bytes")
	}
	return &Builder{key: append([]byte(nil), key...)}, nil
}

// LoadKey reads the pseudonym key from path (inventory.serve.key_file):
// a regular file no other user can read, of at least MinKeyLen bytes
// (trailing newline aside).
func LoadKey(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("inventory.serve.key_file: empty: inventory.scope: node needs a key file shared by every serve instance (e.g. head -c 32 /dev/urandom > FILE; chmod 600 FILE)")
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("inventory.serve.key_file: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o007 != 0 {
		return nil, fmt.Errorf("inventory.serve.key_file %s: mode %s: not a regular file other users cannot read: run chmod 600 %s", path, st.Mode(), path)
	}
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("inventory.serve.key_file: %w", err)
	}
	key = bytes.TrimRight(key, "\r\n")
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("inventory.serve.key_file %s: %d bytes, want at least %d (e.g. head -c 32 /dev/urandom > %s)", path, len(key), MinKeyLen, path)
	}
	return key, nil
}

// Pseudonym is what id becomes in a view when it is not the node's: "x"
// and 24 hex digits (96 bits) of HMAC-SHA-256(key, id). "" stays "".
func (b *Builder) Pseudonym(id string) string {
	if id == "" {
		return ""
	}
	m := hmac.New(sha256.New, b.key)
	m.Write([]byte(id))
	var sum [sha256.Size]byte
	return "x" + hex.EncodeToString(m.Sum(sum[:0])[:12])
}

// Nodes lists the nodes ports are bound to, sorted, each once.
func Nodes(inv *inventory.Inventory) []string {
	seen := map[string]bool{}
	var out []string
	for i := range inv.Ports {
		if h := inv.Ports[i].BindingHostID; h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// view is the state of one View call.
type view struct {
	b   *Builder
	inv *inventory.Inventory
	// keep: ids shown as they are (the node's, external networks', load
	// balancers'); kept is the set mark fills, keep reads it (and, for
	// an overlay, the node's too)
	keep func(string) bool
	kept map[string]bool
	own  map[string]bool // ports bound to the node, and subports of its trunks: whole records
	// local addresses: fixed IPs and address pairs of the node's ports
	// (pool members at them are kept)
	localIPs map[string]bool
	lbLocal  map[string]bool // load balancers with an amphora port on the node
	ampDev   map[string]bool // amphora compute ids (their ports keep device_id)
	memo     map[string]string
}

// id is how an identifier appears in the view.
func (v *view) id(s string) string {
	if s == "" || v.keep(s) {
		return s
	}
	return v.b.pseudonym(v.memo, s)
}

// pseudonym is Pseudonym, remembered in memo.
func (b *Builder) pseudonym(memo map[string]string, s string) string {
	if p, ok := memo[s]; ok {
		return p
	}
	p := b.Pseudonym(s)
	memo[s] = p
	return p
}

func (b *Builder) newView(inv *inventory.Inventory) *view {
	v := &view{b: b, inv: inv, kept: map[string]bool{}, localIPs: map[string]bool{}, lbLocal: map[string]bool{}, ampDev: map[string]bool{}, memo: map[string]string{}, own: map[string]bool{}}
	v.keep = func(s string) bool { return v.kept[s] }
	for i := range inv.Amphorae {
		if c := inv.Amphorae[i].ComputeID; c != "" {
			v.ampDev[c] = true
		}
	}
	return v
}

// View is node's view of inv. inv is not modified; the view shares no
// slice with it. node "" gives the view of a node with no port: what every
// agent learns of the cloud.
func (b *Builder) View(inv *inventory.Inventory, node string) *inventory.Inventory {
	if inv == nil {
		inv = &inventory.Inventory{}
	}
	v := b.newView(inv)
	v.mark(node)
	return v.render()
}

// render is the view once marked.
func (v *view) render() *inventory.Inventory {
	out := &inventory.Inventory{}
	v.projects(out)
	v.networks(out)
	v.ports(out)
	v.routers(out)
	v.floatingIPs(out)
	v.servers(out)
	v.octavia(out)
	v.trunks(out)
	return out
}

// local reports whether p is the node's.
func (v *view) local(p *inventory.Port) bool { return v.own[p.ID] }

// mark fills own, kept, localIPs and lbLocal for node ("": none).
func (v *view) mark(node string) {
	inv := v.inv
	ampLB := map[string]string{} // compute id → load balancer
	for i := range inv.Amphorae {
		ampLB[inv.Amphorae[i].ComputeID] = inv.Amphorae[i].LoadBalancerID
	}
	for i := range inv.Ports {
		if p := &inv.Ports[i]; node != "" && p.BindingHostID == node {
			v.own[p.ID] = true
		}
	}
	// A trunk's subports are where its parent is, bound or not.
	for i := range inv.Trunks {
		if t := &inv.Trunks[i]; v.own[t.PortID] {
			for _, sp := range t.SubPorts {
				v.own[sp.PortID] = true
			}
		}
	}
	for i := range inv.Ports {
		p := &inv.Ports[i]
		if !v.own[p.ID] {
			continue
		}
		v.kept[p.ID] = true
		for _, s := range []string{p.DeviceID, p.NetworkID} {
			if s != "" {
				v.kept[s] = true
			}
		}
		for _, f := range p.FixedIPs {
			v.kept[f.SubnetID] = true
			v.localIPs[f.IPAddress] = true
		}
		for _, a := range p.AllowedAddressPairs {
			v.localIPs[a.IPAddress] = true
		}
		if lb, ok := ampLB[p.DeviceID]; ok && lb != "" {
			v.lbLocal[lb] = true
		}
	}
	// Exit labels are a network's name, else its id: external networks
	// and every network a gateway or floating IP leaves by keep both.
	for i := range inv.Networks {
		if inv.Networks[i].External {
			v.kept[inv.Networks[i].ID] = true
		}
	}
	for i := range inv.Routers {
		if gw := inv.Routers[i].GatewayNetworkID(); gw != "" {
			v.kept[gw] = true
		}
	}
	for i := range inv.FloatingIPs {
		f := &inv.FloatingIPs[i]
		v.kept[f.FloatingNetworkID] = true
		if v.kept[f.PortID] {
			v.kept[f.ID] = true
		}
	}
	// Load balancer, pool and member ids are what records carry (lb_id,
	// pool_id, member_id); a local amphora's VIP port is named by its
	// load balancer's vip_port_id (its floating IP is the amphora's exit).
	for i := range inv.LoadBalancers {
		lb := &inv.LoadBalancers[i]
		v.kept[lb.ID] = true
		if v.lbLocal[lb.ID] && lb.VIPPortID != "" {
			v.kept[lb.VIPPortID] = true
		}
	}
	delete(v.kept, "")
}

func (v *view) projects(out *inventory.Inventory) {
	own := map[string]bool{}
	for i := range v.inv.Ports {
		if p := &v.inv.Ports[i]; v.local(p) {
			own[p.Project()] = true
		}
	}
	for _, p := range v.inv.Projects {
		if own[p.ID] {
			out.Projects = append(out.Projects, p)
		}
	}
}

func (v *view) networks(out *inventory.Inventory) {
	out.Networks = make([]inventory.Network, len(v.inv.Networks))
	for i, n := range v.inv.Networks {
		o := inventory.Network{ID: v.id(n.ID), ProjectID: n.Project(), Shared: n.Shared, External: n.External}
		if v.keep(n.ID) {
			o.Name = n.Name
		}
		out.Networks[i] = o
	}
	out.Subnets = make([]inventory.Subnet, len(v.inv.Subnets))
	for i, s := range v.inv.Subnets {
		o := inventory.Subnet{ID: v.id(s.ID), NetworkID: v.id(s.NetworkID), ProjectID: s.Project(), CIDR: s.CIDR, GatewayIP: s.GatewayIP, IPVersion: s.IPVersion}
		if v.keep(s.ID) {
			o.Name = s.Name
		}
		out.Subnets[i] = o
	}
}

func (v *view) ports(out *inventory.Inventory) {
	out.Ports = make([]inventory.Port, len(v.inv.Ports))
	for i := range v.inv.Ports {
		p := &v.inv.Ports[i]
		if v.local(p) {
			out.Ports[i] = wholePort(p)
			continue
		}
		o := inventory.Port{ID: v.id(p.ID), NetworkID: v.id(p.NetworkID), ProjectID: p.Project(), MACAddress: p.MACAddress, DeviceOwner: p.DeviceOwner}
		switch {
		case strings.HasPrefix(p.DeviceOwner, "network:"):
			o.DeviceID = v.id(p.DeviceID) // a router interface names its router
		case p.DeviceOwner != "":
			o.DeviceOwner = vmOwner
			if v.ampDev[p.DeviceID] {
				o.DeviceID = v.id(p.DeviceID) // an amphora's ports are found by its compute id
			}
		}
		if len(p.FixedIPs) > 0 {
			o.FixedIPs = make([]inventory.FixedIP, len(p.FixedIPs))
			for j, f := range p.FixedIPs {
				o.FixedIPs[j] = inventory.FixedIP{SubnetID: v.id(f.SubnetID), IPAddress: f.IPAddress}
			}
		}
		o.AllowedAddressPairs = append([]inventory.AddressPair(nil), p.AllowedAddressPairs...)
		out.Ports[i] = o
	}
}

func (v *view) routers(out *inventory.Inventory) {
	out.Routers = make([]inventory.Router, len(v.inv.Routers))
	for i := range v.inv.Routers {
		out.Routers[i] = v.router(&v.inv.Routers[i])
	}
}

func (v *view) router(r *inventory.Router) inventory.Router {
	o := inventory.Router{ID: v.id(r.ID), ProjectID: r.Project(), Routes: append([]inventory.Route(nil), r.Routes...)}
	if v.keep(r.ID) {
		o.Name = r.Name
	}
	if g := r.ExternalGatewayInfo; g != nil {
		og := &inventory.GatewayInfo{NetworkID: v.id(g.NetworkID)}
		for _, f := range g.ExternalFixedIPs {
			og.ExternalFixedIPs = append(og.ExternalFixedIPs, inventory.ExternalFixedIP{SubnetID: v.id(f.SubnetID), IPAddress: f.IPAddress})
		}
		o.ExternalGatewayInfo = og
	}
	return o
}

// floatingIPs keeps the node's: attribution reads a floating IP only as
// its port's exit label, and only the VM side's label reaches a record.
func (v *view) floatingIPs(out *inventory.Inventory) {
	for _, f := range v.inv.FloatingIPs {
		if f.PortID != "" && v.keep(f.PortID) {
			out.FloatingIPs = append(out.FloatingIPs, f)
		}
	}
}

func (v *view) servers(out *inventory.Inventory) {
	for _, s := range v.inv.Servers {
		if v.keep(s.ID) {
			out.Servers = append(out.Servers, s)
		}
	}
}

// octavia keeps every load balancer and amphora (a remote amphora is the
// far end of a member's segment 2) without names, management details or
// roles, and of the pools only the members on the node or behind one of
// its amphorae: a record names the member at its own end only.
func (v *view) octavia(out *inventory.Inventory) {
	out.LoadBalancers = make([]inventory.LoadBalancer, len(v.inv.LoadBalancers))
	for i, lb := range v.inv.LoadBalancers {
		out.LoadBalancers[i] = inventory.LoadBalancer{ID: lb.ID, ProjectID: lb.Project(), VIPAddress: lb.VIPAddress,
			VIPPortID: v.id(lb.VIPPortID), VIPSubnetID: v.id(lb.VIPSubnetID), VIPNetworkID: v.id(lb.VIPNetworkID), Provider: lb.Provider}
		if v.lbLocal[lb.ID] {
			out.LoadBalancers[i] = lb
		}
	}
	out.Amphorae = make([]inventory.Amphora, len(v.inv.Amphorae))
	for i, a := range v.inv.Amphorae {
		if v.keep(a.ComputeID) {
			out.Amphorae[i] = a
			continue
		}
		out.Amphorae[i] = inventory.Amphora{ID: v.id(a.ID), LoadBalancerID: a.LoadBalancerID, ComputeID: v.id(a.ComputeID), LBNetworkIP: a.LBNetworkIP, Status: a.Status}
	}
	for i := range v.inv.Pools {
		if o, ok := v.pool(&v.inv.Pools[i]); ok {
			out.Pools = append(out.Pools, o)
		}
	}
}

// pool is p with the members the node needs; false when none.
func (v *view) pool(p *inventory.Pool) (inventory.Pool, bool) {
	local := false
	for _, r := range p.LoadBalancers {
		local = local || v.lbLocal[r.ID]
	}
	o := inventory.Pool{ID: p.ID, ProjectID: p.ProjectID, LoadBalancers: append([]inventory.LoadBalancerRef(nil), p.LoadBalancers...)}
	for _, m := range p.Members {
		if local || v.localIPs[m.Address] {
			o.Members = append(o.Members, inventory.Member{ID: m.ID, Address: m.Address, ProtocolPort: m.ProtocolPort, SubnetID: v.id(m.SubnetID), ProjectID: m.ProjectID})
		}
	}
	if local {
		o.Name = p.Name
	}
	return o, len(o.Members) > 0
}

// trunks keeps every trunk's shape: a subport that shares its parent's
// MAC is not a second claim on that MAC, wherever the trunk is.
func (v *view) trunks(out *inventory.Inventory) {
	for _, t := range v.inv.Trunks {
		if v.own[t.PortID] {
			o := t
			o.SubPorts = append([]inventory.SubPort(nil), t.SubPorts...)
			out.Trunks = append(out.Trunks, o)
			continue
		}
		o := inventory.Trunk{ID: v.id(t.ID), PortID: v.id(t.PortID)}
		for _, s := range t.SubPorts {
			o.SubPorts = append(o.SubPorts, inventory.SubPort{SegmentationType: s.SegmentationType, SegmentationID: s.SegmentationID, PortID: v.id(s.PortID)})
		}
		out.Trunks = append(out.Trunks, o)
	}
}
