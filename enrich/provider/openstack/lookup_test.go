package openstack_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/inventory"
)

// TestContractLookupMAC: a port created in Neutron after the last pass is
// found by one GET /v2.0/ports?mac_address=… (no pass), added to the
// inventory and signalled; a port on a network the inventory lacks asks
// for a pass; an unknown MAC changes nothing.
func TestContractLookupMAC(t *testing.T) {
	b, x := needTopology(t)
	cfg := noauthConfig(b)
	cfg.Refresh = units.Duration(time.Hour)
	p, reg, _ := newProvider(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-p.Ready():
	case <-time.After(time.Minute):
		t.Fatal("Run did not cold-start")
	}
	if _, changed, err := p.Poll(ctx); err != nil || !changed {
		t.Fatalf("first Poll: %v %v", changed, err)
	}
	for len(p.Updates()) > 0 {
		<-p.Updates()
	}
	nu := b.env["NEUTRON_URL"] + "/v2.0"
	mac := fmt.Sprintf("fa:16:3e:%s:%s:5a", x.sfx[0:2], x.sfx[2:4])
	var out struct{ Port struct{ ID string } }
	api(t, "POST", nu+"/ports", nil, map[string]any{"port": map[string]any{"name": "late-vm", "network_id": x.app, "project_id": x.p1,
		"mac_address": mac, "device_owner": "compute:nova", "device_id": uuidish(),
		"fixed_ips": []map[string]string{{"subnet_id": x.appSub}}}}, 201, &out)

	if changed, err := p.LookupMAC(ctx, "FA:16:3E:00:00:01"); err != nil || changed {
		t.Fatalf("lookup of a MAC Neutron lacks: changed %v, err %v", changed, err)
	}
	start := time.Now()
	changed, err := p.LookupMAC(ctx, mac)
	took := time.Since(start)
	if err != nil || !changed {
		t.Fatalf("lookup of the new port's MAC: changed %v, err %v", changed, err)
	}
	t.Logf("targeted lookup found the new port in %s", took.Round(time.Millisecond))
	select {
	case <-p.Updates():
	case <-time.After(5 * time.Second):
		t.Fatal("no update signalled")
	}
	inv, changed, err := p.Poll(ctx)
	if err != nil || !changed || !slices.ContainsFunc(inv.Ports, func(q inventory.Port) bool { return q.ID == out.Port.ID && q.Project() == x.p1 }) {
		t.Fatalf("after the lookup: changed %v, err %v, port present %v", changed, err, inv != nil)
	}
	if n := metricValue(t, reg, "tapflow_inventory_passes_total", "result", "ok"); n != 1 {
		t.Errorf("ok passes %v, want 1 (the cold start only: the lookup is no pass)", n)
	}
	if changed, err := p.LookupMAC(ctx, mac); err != nil || changed {
		t.Errorf("second lookup: changed %v, err %v", changed, err)
	}

	var net struct{ Network struct{ ID string } }
	api(t, "POST", nu+"/networks", nil, map[string]any{"network": map[string]any{"name": "new-" + x.sfx, "project_id": x.p1}}, 201, &net)
	mac2 := fmt.Sprintf("fa:16:3e:%s:%s:5b", x.sfx[0:2], x.sfx[2:4])
	api(t, "POST", nu+"/ports", nil, map[string]any{"port": map[string]any{"name": "new-net-vm", "network_id": net.Network.ID, "project_id": x.p1,
		"mac_address": mac2, "device_owner": "compute:nova", "device_id": uuidish()}}, 201, nil)
	if _, err := p.LookupMAC(ctx, mac2); !errors.Is(err, openstack.ErrNeedsPass) {
		t.Errorf("port on a network the inventory lacks: %v, want ErrNeedsPass", err)
	}
}
