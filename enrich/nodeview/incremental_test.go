package nodeview_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/inventory"
)

// TestOverlaysIncrementalLikeFull runs random sequences of inventory
// changes (a VM boots, is deleted, migrates to another node; a floating
// IP is attached or detached; a pool gains a member; a subnet, network or
// router changes; an external network appears; records are reordered)
// over every inventory of the corpus, and after each change checks that
// every node's overlay from Overlays.Update (rebuilt only where its
// inputs changed) is byte for byte the overlay a full rebuild from a
// fresh index gives, and that Update reports every node whose overlay
// changed.
func TestOverlaysIncrementalLikeFull(t *testing.T) {
	const steps = 150 // per inventory; about 20 s with -race on 2 busy cores
	b, err := nodeview.New(testKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, inv := range corpus(t) {
		t.Run(name, func(t *testing.T) {
			bind(inv, 5)
			rng := rand.New(rand.NewPCG(1, uint64(len(inv.Ports))))
			ov := nodeview.NewOverlays()
			if rebuilt, full := ov.Update(b.NewIndex(inv)); full == "" || len(rebuilt) != len(nodeview.Nodes(inv)) {
				t.Fatalf("first Update rebuilt %d of %d (full %q)", len(rebuilt), len(nodeview.Nodes(inv)), full)
			}
			prev := map[string][]byte{}
			for _, n := range nodeview.Nodes(inv) {
				prev[n], _, _ = ov.Encoded(n)
			}
			partial, skipped := 0, 0
			counts := map[string]int{}
			for step := range steps {
				next := deepCopy(t, inv)
				what := mutate(rng, next, step)
				counts[what]++
				rebuilt, full := ov.Update(b.NewIndex(next))
				fresh := b.NewIndex(next)
				nodes := fresh.Nodes()
				if !slices.Equal(nodes, ov.Nodes()) {
					t.Fatalf("step %d (%s): nodes %v, want %v", step, what, ov.Nodes(), nodes)
				}
				if full == "" {
					partial++
					skipped += len(nodes) - len(rebuilt)
				}
				cur := map[string][]byte{}
				for _, n := range nodes {
					want, err := nodeview.Encode(fresh.Overlay(n))
					if err != nil {
						t.Fatal(err)
					}
					got, _, err := ov.Encoded(n)
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("step %d (%s): node %s: incremental overlay differs from a full rebuild (%d vs %d bytes, err %v; rebuilt %v, full %q)",
							step, what, n, len(got), len(want), err, rebuilt, full)
					}
					if !bytes.Equal(want, prev[n]) && !slices.Contains(rebuilt, n) {
						t.Fatalf("step %d (%s): node %s changed but is not reported rebuilt", step, what, n)
					}
					cur[n] = want
				}
				inv, prev = next, cur
			}
			// the incremental path must be the common one, or this test
			// would only compare full rebuilds
			if partial < steps*2/3 || skipped == 0 {
				t.Fatalf("only %d of %d changes rebuilt by keys (%d overlays skipped): %v", partial, steps, skipped, counts)
			}
			t.Logf("%d of %d changes rebuilt by keys, %d overlays not rebuilt; changes: %v", partial, steps, skipped, counts)
		})
	}
}

// deepCopy is inv with no slice shared: Update compares the inventory it
// indexed last with the next one, so a change must not write into it.
func deepCopy(t *testing.T, inv *inventory.Inventory) *inventory.Inventory {
	t.Helper()
	data, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	out := &inventory.Inventory{}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// mutate applies one random change to inv and names it.
func mutate(rng *rand.Rand, inv *inventory.Inventory, step int) string {
	vms := func() []int {
		var out []int
		for i, p := range inv.Ports {
			if strings.HasPrefix(p.DeviceOwner, "compute:") && p.BindingHostID != "" {
				out = append(out, i)
			}
		}
		return out
	}()
	node := func() string { return fmt.Sprintf("cmp%03d", rng.IntN(6)) } // cmp005 is new
	pick := func(n int) int { return rng.IntN(max(n, 1)) }
	switch k := rng.IntN(20); {
	case k < 4 && len(vms) > 0: // a VM boots next to another, on some node
		tmpl := inv.Ports[vms[pick(len(vms))]]
		id := fmt.Sprintf("boot-%d", step)
		p := inventory.Port{ID: "port-" + id, NetworkID: tmpl.NetworkID, ProjectID: tmpl.ProjectID, DeviceOwner: "compute:nova",
			DeviceID: "vm-" + id, MACAddress: fmt.Sprintf("fa:16:3f:00:%02x:%02x", step>>8, step&0xff), BindingHostID: node()}
		if len(tmpl.FixedIPs) > 0 {
			p.FixedIPs = []inventory.FixedIP{{SubnetID: tmpl.FixedIPs[0].SubnetID, IPAddress: fmt.Sprintf("10.250.%d.%d", step>>8, step&0xff)}}
		}
		inv.Ports = append(inv.Ports, p)
		inv.Servers = append(inv.Servers, inventory.Server{ID: p.DeviceID, Name: id, ProjectID: p.ProjectID})
		return "boot"
	case k < 6 && len(vms) > 1: // a VM is deleted: its ports and server
		dev := inv.Ports[vms[pick(len(vms))]].DeviceID
		inv.Ports = slices.DeleteFunc(inv.Ports, func(p inventory.Port) bool { return p.DeviceID == dev })
		inv.Servers = slices.DeleteFunc(inv.Servers, func(s inventory.Server) bool { return s.ID == dev })
		return "delete"
	case k < 9 && len(vms) > 0: // a VM migrates: all its ports
		dev, to := inv.Ports[vms[pick(len(vms))]].DeviceID, node()
		for i := range inv.Ports {
			if inv.Ports[i].DeviceID == dev {
				inv.Ports[i].BindingHostID = to
			}
		}
		return "migrate"
	case k < 11 && len(inv.FloatingIPs) > 0 && len(vms) > 0: // a floating IP moves to a VM
		f, p := &inv.FloatingIPs[pick(len(inv.FloatingIPs))], inv.Ports[vms[pick(len(vms))]]
		f.PortID = p.ID
		if len(p.FixedIPs) > 0 {
			f.FixedIPAddress = p.FixedIPs[0].IPAddress
		}
		return "fip attach"
	case k < 13 && len(inv.FloatingIPs) > 0:
		f := &inv.FloatingIPs[pick(len(inv.FloatingIPs))]
		f.PortID, f.FixedIPAddress = "", ""
		return "fip detach"
	case k < 15 && len(inv.Pools) > 0 && len(vms) > 0: // a VM joins a pool
		pl, p := &inv.Pools[pick(len(inv.Pools))], inv.Ports[vms[pick(len(vms))]]
		if len(p.FixedIPs) == 0 {
			return "nothing"
		}
		pl.Members = append(pl.Members, inventory.Member{ID: fmt.Sprintf("member-%d", step), Address: p.FixedIPs[0].IPAddress, ProtocolPort: 80, SubnetID: p.FixedIPs[0].SubnetID, ProjectID: pl.ProjectID})
		return "member add"
	case k < 17 && len(inv.Subnets) > 0: // a subnet's gateway or name changes
		s := &inv.Subnets[pick(len(inv.Subnets))]
		if rng.IntN(2) == 0 {
			s.Name += "-renamed"
		} else {
			s.GatewayIP = ""
		}
		return "subnet change"
	case k < 18 && len(inv.Networks) > 0: // a network renamed
		inv.Networks[pick(len(inv.Networks))].Name += "-renamed"
		return "network change"
	case k < 19 && len(inv.Routers) > 0: // a router gains a route, or loses its gateway
		r := &inv.Routers[pick(len(inv.Routers))]
		if rng.IntN(3) == 0 {
			r.ExternalGatewayInfo = nil
			return "router gateway removed"
		}
		r.Routes = append(r.Routes, inventory.Route{Destination: fmt.Sprintf("10.251.%d.0/24", step&0xff), NextHop: "10.0.0.1"})
		return "router change"
	case rng.IntN(3) == 0 && len(inv.Networks) > 0: // a network becomes external
		inv.Networks[pick(len(inv.Networks))].External = true
		return "external network"
	case len(inv.Servers) > 1: // the cloud lists servers in another order
		i, j := pick(len(inv.Servers)), pick(len(inv.Servers))
		inv.Servers[i], inv.Servers[j] = inv.Servers[j], inv.Servers[i]
		return "reorder"
	}
	return "nothing"
}
