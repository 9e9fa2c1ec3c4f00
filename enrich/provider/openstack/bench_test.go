package openstack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/inventory"
)

var benchOnce sync.Once

// BenchmarkColdStart10kPorts: a cold start (first complete pass: every
// collection, all pages) against the real testbed with 10,000 more ports
// on one /16 (cloned in Neutron's database by lib/bulk_ports.py, because
// creating them through the API takes ~0.25 s each on SQLite).
//
//	TAPFLOW_OPENSTACK=1 go test -run '^$' -bench ColdStart -benchtime 3x ./enrich/provider/openstack/
func BenchmarkColdStart10kPorts(b *testing.B) {
	tb := needTestbed(b)
	benchOnce.Do(func() {
		nu := tb.env["NEUTRON_URL"] + "/v2.0"
		var net, sub, port struct {
			Network, Subnet, Port struct{ ID string }
		}
		api(b, "POST", nu+"/networks", nil, map[string]any{"network": map[string]any{"name": "bench", "project_id": "bench-project-0"}}, 201, &net)
		api(b, "POST", nu+"/subnets", nil, map[string]any{"subnet": map[string]any{"name": "bench", "network_id": net.Network.ID,
			"ip_version": 4, "cidr": "10.128.0.0/16", "project_id": "bench-project-0"}}, 201, &sub)
		api(b, "POST", nu+"/ports", nil, map[string]any{"port": map[string]any{"name": "bench-template", "network_id": net.Network.ID,
			"project_id": "bench-project-0", "device_owner": "compute:nova", "device_id": "bench-template",
			"fixed_ips": []map[string]string{{"subnet_id": sub.Subnet.ID, "ip_address": "10.128.0.10"}}}}, 201, &port)
		start := time.Now()
		out, err := exec.Command("/usr/bin/python3", filepath.Join(tb.scripts, "lib", "bulk_ports.py"),
			filepath.Join(tb.dir, "neutron", "neutron.db"), port.Port.ID, "9999").CombinedOutput()
		if err != nil {
			b.Fatalf("bulk_ports.py: %v: %s", err, out)
		}
		b.Logf("cloned 9,999 ports in %s", time.Since(start).Round(time.Millisecond))
	})
	ctx := context.Background()
	ports := 0
	for b.Loop() {
		p, _, _ := newProvider(b, noauthConfig(tb))
		inv, _, err := p.Poll(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ports = len(inv.Ports)
	}
	if ports < 10000 {
		b.Fatalf("%d ports", ports)
	}
	b.ReportMetric(float64(ports), "ports")
	b.Log(fmt.Sprintf("cold start over %d ports", ports))
}

var fleetOnce sync.Once

// BenchmarkFleetPoll100kPorts: the metadata service's poll (one complete
// pass: every collection, all pages) against the real testbed grown to a
// fleet-sized cloud — 100,000 more VM ports over 1,000 projects, 10,000
// routers with gateway ports and 50,000 floating IPs with floating ports
// (160,000 more ports in all), cloned in Neutron's database by
// lib/bulk_fleet.py from templates made through the API. It reports the
// snapshot the service publishes (bytes on the wire), and what the same
// refresh costs Neutron when 1,000 agents each poll (today's per-agent
// polling) against one service.
//
//	TAPFLOW_OPENSTACK=1 go test -run '^$' -bench FleetPoll -benchtime 1x -timeout 60m ./enrich/provider/openstack/
func BenchmarkFleetPoll100kPorts(b *testing.B) {
	tb := needTestbed(b)
	const vmPorts, routers, fips = 100_000, 10_000, 50_000
	fleetOnce.Do(func() {
		nu := tb.env["NEUTRON_URL"] + "/v2.0"
		type obj struct {
			Network, Subnet, Port, Router, Floatingip struct{ ID string }
		}
		var ext, extSub, net, sub, port, router, fip obj
		api(b, "POST", nu+"/networks", nil, map[string]any{"network": map[string]any{"name": "fleet-ext", "router:external": true}}, 201, &ext)
		api(b, "POST", nu+"/subnets", nil, map[string]any{"subnet": map[string]any{"name": "fleet-ext", "network_id": ext.Network.ID,
			"ip_version": 4, "cidr": "198.18.0.0/15", "enable_dhcp": false}}, 201, &extSub)
		api(b, "POST", nu+"/networks", nil, map[string]any{"network": map[string]any{"name": "fleet", "project_id": "fleet-project-0"}}, 201, &net)
		api(b, "POST", nu+"/subnets", nil, map[string]any{"subnet": map[string]any{"name": "fleet", "network_id": net.Network.ID,
			"ip_version": 4, "cidr": "10.64.0.0/14", "project_id": "fleet-project-0"}}, 201, &sub)
		api(b, "POST", nu+"/ports", nil, map[string]any{"port": map[string]any{"name": "fleet-template", "network_id": net.Network.ID,
			"project_id": "fleet-project-0", "device_owner": "compute:nova", "device_id": "fleet-template",
			"fixed_ips": []map[string]string{{"subnet_id": sub.Subnet.ID, "ip_address": "10.64.0.10"}}}}, 201, &port)
		api(b, "POST", nu+"/routers", nil, map[string]any{"router": map[string]any{"name": "fleet-template", "project_id": "fleet-project-0",
			"external_gateway_info": map[string]any{"network_id": ext.Network.ID,
				"external_fixed_ips": []map[string]string{{"subnet_id": extSub.Subnet.ID, "ip_address": "198.18.0.10"}}}}}, 201, &router)
		api(b, "PUT", nu+"/routers/"+router.Router.ID+"/add_router_interface", nil, map[string]any{"subnet_id": sub.Subnet.ID}, 200, nil)
		// The template floating IP sits far above the gateways' addresses,
		// so the clones of the two never collide.
		api(b, "POST", nu+"/floatingips", nil, map[string]any{"floatingip": map[string]any{"floating_network_id": ext.Network.ID,
			"floating_ip_address": "198.18.128.10", "port_id": port.Port.ID, "project_id": "fleet-project-0"}}, 201, &fip)
		start := time.Now()
		out, err := exec.Command("/usr/bin/python3", filepath.Join(tb.scripts, "lib", "bulk_fleet.py"),
			filepath.Join(tb.dir, "neutron", "neutron.db"), port.Port.ID, router.Router.ID, fip.Floatingip.ID,
			fmt.Sprint(vmPorts), fmt.Sprint(routers), fmt.Sprint(fips)).CombinedOutput()
		if err != nil {
			b.Fatalf("bulk_fleet.py: %v: %s", err, out)
		}
		b.Logf("%s in %s", bytes.TrimSpace(out), time.Since(start).Round(time.Millisecond))
	})
	ctx := context.Background()
	var inv *inventory.Inventory
	var poll time.Duration
	for b.Loop() {
		p, _, _ := newProvider(b, noauthConfig(tb))
		start := time.Now()
		got, _, err := p.Poll(ctx)
		if err != nil {
			b.Fatal(err)
		}
		poll, inv = time.Since(start), got
	}
	if len(inv.Ports) < vmPorts+routers+fips || len(inv.Routers) < routers || len(inv.FloatingIPs) < fips {
		b.Fatalf("the poll saw %d ports, %d routers, %d floating IPs; want at least %d, %d, %d",
			len(inv.Ports), len(inv.Routers), len(inv.FloatingIPs), vmPorts+routers+fips, routers, fips)
	}
	wire, _, err := natsinv.Encode(natsinv.Normalize(inv))
	if err != nil {
		b.Fatal(err)
	}
	js, err := json.Marshal(inv)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(inv.Ports)), "ports")
	b.ReportMetric(float64(len(inv.Routers)), "routers")
	b.ReportMetric(float64(len(inv.FloatingIPs)), "fips")
	b.ReportMetric(poll.Seconds(), "poll-s")
	b.ReportMetric(float64(len(wire)), "snapshot-B")
	b.ReportMetric(float64(len(js)), "json-B")
	b.Logf("one poll: %d ports, %d routers, %d floating IPs in %s; snapshot %d B on the wire (JSON %d B); "+
		"Neutron time per refresh: 1,000 agents polling ≈ %s, one service = %s",
		len(inv.Ports), len(inv.Routers), len(inv.FloatingIPs), poll.Round(time.Millisecond), len(wire), len(js),
		(1000 * poll).Round(time.Second), poll.Round(time.Millisecond))
}
