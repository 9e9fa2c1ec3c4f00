package invserve

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
)

// viewsCloud is a synthetic cloud whose VM and amphora ports sit on cmp1
// and cmp2 by turns, written where the file source reads it.
func viewsCloud(t *testing.T, path string, extra int) *inventory.Inventory {
	t.Helper()
	inv := synth.Generate(synth.Options{Tenants: 6, VMsPerTenant: 4, LoadBalancers: 2, ExternalNetworks: 1})
	for i := range extra {
		inv.Ports = append(inv.Ports, inventory.Port{ID: fmt.Sprintf("late-%d", i), NetworkID: "net-1-0", ProjectID: synth.Project(1),
			MACAddress: fmt.Sprintf("fa:16:3e:ee:00:%02x", i), DeviceOwner: "compute:nova", DeviceID: fmt.Sprintf("srv-late-%d", i),
			FixedIPs: []inventory.FixedIP{{SubnetID: "sub-1-0", IPAddress: fmt.Sprintf("10.0.1.%d", 100+i)}}})
	}
	n := 0
	for i := range inv.Ports {
		switch p := &inv.Ports[i]; p.DeviceOwner {
		case "compute:nova":
			p.BindingHostID = []string{"cmp1", "cmp2"}[n%2]
			n++
		case "network:router_interface", "network:dhcp":
			p.BindingHostID = "net1" // a network node: no overlay
		}
	}
	data, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return inv
}

// digest identifies an inventory's content whatever its order.
func digest(t *testing.T, inv *inventory.Inventory) string {
	t.Helper()
	_, d, err := natsinv.Encode(natsinv.Normalize(inv))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestServeNodeViews runs inventory.scope: node end to end: the service
// publishes the shared view and each node's overlay; an agent's provider
// merges its node's into exactly its view; a VM booting on cmp1 reaches
// cmp1's agent and changes no other node's overlay.
func TestServeNodeViews(t *testing.T) {
	srv := transporttest.Run(t, "")
	dir := t.TempDir()
	path := filepath.Join(dir, "inv.json")
	inv := viewsCloud(t, path, 0)
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := nodeview.LoadKey(key)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := nodeview.New(k)
	if err != nil {
		t.Fatal(err)
	}
	f, err := inventory.NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(Config{Instance: "a", Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond, Views: nb,
		Guard: inventory.DropGuard{MaxDrop: 1, ConfirmReads: 1}}, fileSource{f}, srv.JS, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	actx, acancel := context.WithCancel(ctx) // instance a, stopped for the takeover below
	sdone := make(chan struct{})
	go func() { defer close(sdone); _ = s.Run(actx) }()
	t.Cleanup(func() { acancel(); <-sdone })

	agent := func(node string) *nodeview.Provider {
		inner, err := natsinv.NewProvider(srv.NC, natsinv.Options{StatePath: filepath.Join(dir, node+".state"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		p, err := nodeview.NewProvider(inner, srv.NC, nodeview.Options{Node: node, StatePath: filepath.Join(dir, node+".overlay"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = p.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return p
	}
	// poll waits until p's inventory is node's view of want.
	poll := func(p *nodeview.Provider, node string, want *inventory.Inventory) {
		t.Helper()
		w := digest(t, nb.View(want, node))
		for deadline := time.Now().Add(wait); ; {
			pctx, pcancel := context.WithTimeout(ctx, wait)
			got, changed, err := p.Poll(pctx)
			pcancel()
			if err != nil {
				t.Fatalf("%s: %v", node, err)
			}
			if changed && digest(t, got) == w {
				if slices.ContainsFunc(got.Ports, func(q inventory.Port) bool { return q.BindingHostID != "" && q.BindingHostID != node }) {
					t.Fatalf("%s holds another node's port whole", node)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no inventory equal to its view after %s", node, wait)
			}
			select {
			case <-p.Updates():
			case <-time.After(time.Second):
			}
		}
	}
	a1, a2 := agent("cmp1"), agent("cmp2")
	poll(a1, "cmp1", inv)
	poll(a2, "cmp2", inv)
	ok := testutil.ToFloat64(s.overlaysN.WithLabelValues("ok"))
	if ok != 2 {
		t.Fatalf("%v overlays published for 2 nodes", ok)
	}

	// A VM boots on cmp1 (ports alternate: the new one, the 49th VM-like
	// port, goes to cmp1).
	inv = viewsCloud(t, path, 1)
	if h := inv.Ports[len(inv.Ports)-1].BindingHostID; h != "cmp1" {
		t.Fatalf("the new port is on %s", h)
	}
	poll(a1, "cmp1", inv)
	if got := testutil.ToFloat64(s.overlaysN.WithLabelValues("ok")); got != ok+1 {
		t.Fatalf("%v overlays published for a change on one node, want 1", got-ok)
	}
	if e := testutil.ToFloat64(s.overlaysN.WithLabelValues("error")); e != 0 {
		t.Fatalf("%v overlays failed", e)
	}

	// Takeover: a stops (and hands the lease over); b finds every
	// overlay the stream holds equal to its own and republishes none,
	// then publishes the one a second boot on cmp1 changes.
	acancel()
	<-sdone
	fb, err := inventory.NewFile(path) // b's own reader: it reads the file from the start
	if err != nil {
		t.Fatal(err)
	}
	sb, err := New(Config{Instance: "b", Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond, Views: nb,
		Guard: inventory.DropGuard{MaxDrop: 1, ConfirmReads: 1}}, fileSource{fb}, srv.JS, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	bdone := make(chan struct{})
	go func() { defer close(bdone); _ = sb.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-bdone })
	for deadline := time.Now().Add(wait); testutil.ToFloat64(sb.published.WithLabelValues("unchanged"))+testutil.ToFloat64(sb.published.WithLabelValues("ok")) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("instance b published nothing in %s", wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := testutil.ToFloat64(sb.overlaysN.WithLabelValues("ok")); got != 0 {
		t.Fatalf("takeover republished %v unchanged overlays", got)
	}
	inv = viewsCloud(t, path, 3) // two more VMs: late-1 on cmp2, late-2 on cmp1
	poll(a1, "cmp1", inv)
	poll(a2, "cmp2", inv)
	if got := testutil.ToFloat64(sb.overlaysN.WithLabelValues("ok")); got != 2 {
		t.Fatalf("instance b published %v overlays for a change on both nodes, want 2", got)
	}
}
