package natsinv

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
)

func TestDiffApply(t *testing.T) {
	base := Normalize(synth.Generate(synth.Options{Tenants: 30, VMsPerTenant: 4, LoadBalancers: 2, FloatingIPsPerTenant: 2}))
	cases := []struct {
		name    string
		edit    func(inv *inventory.Inventory)
		changed int
	}{
		{"nothing", func(*inventory.Inventory) {}, 0},
		{"port added", func(inv *inventory.Inventory) {
			inv.Ports = append(inv.Ports, inventory.Port{ID: "new", MACAddress: "fa:16:3e:99:99:99", NetworkID: "net-0-0"})
		}, 1},
		{"port removed", func(inv *inventory.Inventory) { inv.Ports = inv.Ports[1:] }, 1},
		{"port changed", func(inv *inventory.Inventory) { inv.Ports[3].FixedIPs = nil }, 1},
		{"floating IP moved and pool member added", func(inv *inventory.Inventory) {
			inv.FloatingIPs[0].PortID = inv.Ports[7].ID
			inv.Pools[0].Members = append(inv.Pools[0].Members, inventory.Member{ID: "m-new", Address: "10.0.0.99"})
		}, 2},
		{"tenant gone", func(inv *inventory.Inventory) {
			inv.Projects = inv.Projects[:len(inv.Projects)-1]
			inv.Servers = inv.Servers[4:]
		}, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next := *base
			next.Ports = append([]inventory.Port(nil), base.Ports...)
			next.FloatingIPs = append([]inventory.FloatingIP(nil), base.FloatingIPs...)
			next.Pools = append([]inventory.Pool(nil), base.Pools...)
			next.Pools[0].Members = append([]inventory.Member(nil), base.Pools[0].Members...)
			c.edit(&next)
			nn := Normalize(&next)
			d := Diff(base, nn)
			if d.Len() != c.changed {
				t.Fatalf("changes %d, want %d: %+v", d.Len(), c.changed, d.Delete)
			}
			if got := Apply(base, d); !reflect.DeepEqual(got, nn) {
				t.Fatal("Apply(Diff(a, b)) != b")
			}
		})
	}
}

func TestAgentAppliesDeltasWithoutDownloading(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r1, err := PublishFrom(ctx, e.srv.NC, e.obs, nil, "", cloud(400), time.Now())
	if err != nil || r1.DeltaBytes != 0 {
		t.Fatalf("first publish: %+v %v", r1, err)
	}
	a := startAgent(t, e.srv.NC, filepath.Join(t.TempDir(), "s"), true)
	a.pollFor(t, 1)
	prev, digest := r1.Inv, r1.Digest
	for v := uint64(2); v <= 5; v++ {
		next := *prev
		next.Ports = append(append([]inventory.Port(nil), prev.Ports...), inventory.Port{ID: "zz-new-" + string(rune('a'+v)), MACAddress: "fa:16:3e:77:00:0" + string(rune('0'+v))})
		r, err := PublishFrom(ctx, e.srv.NC, e.obs, prev, digest, &next, time.Now())
		if err != nil || r.Version != v {
			t.Fatalf("publish v%d: %+v %v", v, r, err)
		}
		if r.DeltaBytes == 0 || r.DeltaBytes*20 > r.Bytes {
			t.Fatalf("delta %d bytes for a snapshot of %d", r.DeltaBytes, r.Bytes)
		}
		inv := a.pollFor(t, v)
		if !reflect.DeepEqual(inv, r.Inv) {
			t.Fatalf("v%d: the agent's inventory differs from the service's", v)
		}
		prev, digest = r.Inv, r.Digest
	}
	if d, ok := a.count("delta"), a.count("ok"); d != 4 || ok != 1 {
		t.Fatalf("deltas %v, downloads %v; want 4 and 1", d, ok)
	}
}

func TestDeltaNotForTheHeldVersionIsIgnored(t *testing.T) {
	e := newEnv(t)
	a := startAgent(t, e.srv.NC, filepath.Join(t.TempDir(), "s"), false)
	inv := Normalize(cloud(5))
	a.p.set(&Snapshot{Version: 1, FetchedAt: time.Now(), Inv: inv}, nil)
	next := *inv
	next.Ports = next.Ports[1:]
	for _, c := range []struct {
		name   string
		base   uint64
		ports  int
		result string
	}{
		{"base is not the version held", 4, len(next.Ports), ""},
		{"result does not match the service's count", 1, len(next.Ports) + 1, "decode_error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := a.count("decode_error")
			m, err := encodeDelta(c.base, &Snapshot{Version: c.base + 1, FetchedAt: time.Now(), Inv: &inventory.Inventory{Ports: make([]inventory.Port, c.ports)}}, Diff(inv, &next))
			if err != nil {
				t.Fatal(err)
			}
			if a.p.applyDelta(m) {
				t.Fatal("applied")
			}
			if a.p.Current().Version != 1 {
				t.Fatal("held version changed")
			}
			if c.result != "" && a.count(c.result) != before+1 {
				t.Errorf("%s not counted", c.result)
			}
		})
	}
}
