package openstack_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
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
