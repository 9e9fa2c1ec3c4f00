package openstack_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

// topo is the cloud the contract tests build through the real APIs, once
// per test binary:
//
//	projects acme (P1) and globex (P2) in Keystone
//	public-X    external flat network 203.0.113.0/24 (admin)
//	web-X       P1's shared network 10.0.1.0/24 (the LB's VIP network)
//	app-X       P1's private network 10.0.2.0/24
//	router-X    P1: gateway on public-X, interfaces on web and app,
//	            static route 10.9.0.0/16 via 10.0.2.50
//	vm1         P1 on app 10.0.2.10, floating IP 203.0.113.50, server s1
//	vm2         P2 on web 10.0.1.30 with allowed-address pairs
//	            10.0.1.200 and 10.0.1.201+own MAC, server s2
//	vm3         P1 on web 10.0.1.11, server s3
//	lb1         P1, amphora, ACTIVE_STANDBY, VIP on web, one pool with
//	            members 10.0.1.11 (web) and 10.0.2.10 (app: Octavia plugs
//	            each amphora into app with a port that has no Octavia marker)
//	noop-lb     P1, provider noop_driver (skipped by the provider)
type topo struct {
	sfx                    string
	p1, p2                 string // Keystone project ids
	p1Name, p2Name         string
	publicNet, publicName  string
	web, webSub, app       string
	appSub, router         string
	vm1, vm2, vm3          string // port ids
	vm1MAC, vm2MAC, vm3MAC string
	aapMAC                 string
	s1, s2, s3             string // server ids
	lb, pool, noopLB       string
	vip                    string
}

var (
	topoOnce sync.Once
	topology *topo
	topoErr  string
)

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func uuidish() string {
	h := randHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// needTopology builds the topology on first use; a failure fails every
// test that needs it.
func needTopology(t *testing.T) (*testbed, *topo) {
	t.Helper()
	b := needTestbed(t)
	topoOnce.Do(func() {
		start := time.Now()
		ok := t.Run("build topology", func(t *testing.T) { topology = buildTopology(t, b) })
		if !ok {
			topoErr = "building the topology failed (see the first test's output)"
			topology = nil
			return
		}
		t.Logf("topology built through the real APIs in %s", time.Since(start).Round(100*time.Millisecond))
	})
	if topology == nil {
		t.Fatal(topoErr)
	}
	return b, topology
}

func buildTopology(t *testing.T, b *testbed) *topo {
	x := &topo{sfx: randHex(3)}
	ks, nu, oc := b.env["KEYSTONE_URL"], b.env["NEUTRON_URL"]+"/v2.0", b.env["OCTAVIA_URL"]
	tok := map[string]string{"X-Auth-Token": b.adminToken(t)}
	mac := func(last byte) string { return fmt.Sprintf("fa:16:3e:%s:%s:%02x", x.sfx[0:2], x.sfx[2:4], last) }

	var proj struct{ Project struct{ ID, Name string } }
	x.p1Name, x.p2Name = "acme-"+x.sfx, "globex-"+x.sfx
	api(t, "POST", ks+"/v3/projects", tok, map[string]any{"project": map[string]any{"name": x.p1Name, "domain_id": "default"}}, 201, &proj)
	x.p1 = proj.Project.ID
	api(t, "POST", ks+"/v3/projects", tok, map[string]any{"project": map[string]any{"name": x.p2Name, "domain_id": "default"}}, 201, &proj)
	x.p2 = proj.Project.ID

	id := func(kind string, body map[string]any) string {
		var out map[string]map[string]any
		api(t, "POST", nu+"/"+kind+"s", nil, map[string]any{kind: body}, 201, &out)
		return out[kind]["id"].(string)
	}
	x.publicName = "public-" + x.sfx
	x.publicNet = id("network", map[string]any{"name": x.publicName, "router:external": true, "provider:network_type": "flat",
		"provider:physical_network": "public" + x.sfx, "project_id": "admin"})
	id("subnet", map[string]any{"name": "public-sub", "network_id": x.publicNet, "ip_version": 4, "cidr": "203.0.113.0/24",
		"gateway_ip": "203.0.113.1", "enable_dhcp": false, "project_id": "admin"})
	x.web = id("network", map[string]any{"name": "web-" + x.sfx, "project_id": x.p1, "shared": true})
	x.webSub = id("subnet", map[string]any{"name": "web-sub", "network_id": x.web, "ip_version": 4, "cidr": "10.0.1.0/24", "project_id": x.p1})
	x.app = id("network", map[string]any{"name": "app-" + x.sfx, "project_id": x.p1})
	x.appSub = id("subnet", map[string]any{"name": "app-sub", "network_id": x.app, "ip_version": 4, "cidr": "10.0.2.0/24", "project_id": x.p1})
	x.router = id("router", map[string]any{"name": "router-" + x.sfx, "project_id": x.p1,
		"external_gateway_info": map[string]any{"network_id": x.publicNet}})
	for _, s := range []string{x.webSub, x.appSub} {
		api(t, "PUT", nu+"/routers/"+x.router+"/add_router_interface", nil, map[string]any{"subnet_id": s}, 200, nil)
	}
	api(t, "PUT", nu+"/routers/"+x.router, nil, map[string]any{"router": map[string]any{
		"routes": []map[string]string{{"destination": "10.9.0.0/16", "nexthop": "10.0.2.50"}}}}, 200, nil)

	x.s1, x.s2, x.s3 = uuidish(), uuidish(), uuidish()
	x.vm1MAC, x.vm2MAC, x.vm3MAC, x.aapMAC = mac(1), mac(2), mac(3), mac(0x99)
	port := func(name, net, sub, project, m, ip, dev string, extra map[string]any) string {
		body := map[string]any{"name": name, "network_id": net, "project_id": project, "mac_address": m,
			"device_owner": "compute:nova", "device_id": dev, "fixed_ips": []map[string]string{{"subnet_id": sub, "ip_address": ip}}}
		for k, v := range extra {
			body[k] = v
		}
		return id("port", body)
	}
	x.vm1 = port("vm1", x.app, x.appSub, x.p1, x.vm1MAC, "10.0.2.10", x.s1, nil)
	x.vm2 = port("vm2", x.web, x.webSub, x.p2, x.vm2MAC, "10.0.1.30", x.s2, map[string]any{"allowed_address_pairs": []map[string]string{
		{"ip_address": "10.0.1.200/32"}, {"ip_address": "10.0.1.201", "mac_address": x.aapMAC}}})
	x.vm3 = port("vm3", x.web, x.webSub, x.p1, x.vm3MAC, "10.0.1.11", x.s3, nil)
	// the static route's next hop: a VM appliance of P1
	port("appliance", x.app, x.appSub, x.p1, mac(4), "10.0.2.50", uuidish(), nil)
	id("floatingip", map[string]any{"floating_network_id": x.publicNet, "project_id": x.p1, "port_id": x.vm1,
		"floating_ip_address": "203.0.113.50"})
	b.novaServers(t,
		fmt.Sprintf("%s,vm1-%s,%s,%s,%s,10.0.2.10,203.0.113.50", x.s1, x.sfx, x.p1, x.vm1, x.vm1MAC),
		fmt.Sprintf("%s,vm2-%s,%s,%s,%s,10.0.1.30", x.s2, x.sfx, x.p2, x.vm2, x.vm2MAC),
		fmt.Sprintf("%s,vm3-%s,%s,%s,%s,10.0.1.11", x.s3, x.sfx, x.p1, x.vm3, x.vm3MAC))

	// LB, listener, pool, then one member per subnet, each step once the
	// LB is ACTIVE again (a single-call tree leaves the children
	// PENDING_CREATE with the noop amphora driver). Creating the member on
	// app makes the worker plug each amphora into app with a port that
	// carries no Octavia marker.
	oh := map[string]string{"X-Project-Id": x.p1}
	var lb struct{ Loadbalancer struct{ ID string } }
	api(t, "POST", oc+"/v2/lbaas/loadbalancers", oh, map[string]any{"loadbalancer": map[string]any{
		"name": "lb1-" + x.sfx, "vip_subnet_id": x.webSub, "provider": "amphora"}}, 201, &lb)
	x.lb = lb.Loadbalancer.ID
	api(t, "POST", oc+"/v2/lbaas/loadbalancers", oh, map[string]any{"loadbalancer": map[string]any{
		"name": "noop-" + x.sfx, "vip_subnet_id": x.webSub, "provider": "noop_driver"}}, 201, &lb)
	x.noopLB = lb.Loadbalancer.ID
	waitLB := func() {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			var st struct {
				Loadbalancer struct {
					ProvisioningStatus string `json:"provisioning_status"`
				}
			}
			api(t, "GET", oc+"/v2/lbaas/loadbalancers/"+x.lb, nil, nil, 200, &st)
			if st.Loadbalancer.ProvisioningStatus == "ACTIVE" {
				return
			}
			if st.Loadbalancer.ProvisioningStatus == "ERROR" || time.Now().After(deadline) {
				t.Fatalf("load balancer %s is %s (octavia-worker log: %s/log/octavia-worker.log)", x.lb, st.Loadbalancer.ProvisioningStatus, b.dir)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	waitLB()
	var listener struct{ Listener struct{ ID string } }
	api(t, "POST", oc+"/v2/lbaas/listeners", oh, map[string]any{"listener": map[string]any{
		"name": "l1", "protocol": "HTTP", "protocol_port": 80, "loadbalancer_id": x.lb}}, 201, &listener)
	waitLB()
	var pool struct{ Pool struct{ ID string } }
	api(t, "POST", oc+"/v2/lbaas/pools", oh, map[string]any{"pool": map[string]any{
		"name": "pool1", "protocol": "HTTP", "lb_algorithm": "ROUND_ROBIN", "listener_id": listener.Listener.ID}}, 201, &pool)
	x.pool = pool.Pool.ID
	waitLB()
	for _, m := range []struct{ addr, sub string }{{"10.0.1.11", x.webSub}, {"10.0.2.10", x.appSub}} {
		api(t, "POST", oc+"/v2/lbaas/pools/"+x.pool+"/members", oh, map[string]any{"member": map[string]any{
			"address": m.addr, "protocol_port": 8080, "subnet_id": m.sub}}, 201, nil)
		waitLB()
	}
	var full struct {
		Loadbalancer struct {
			VIP string `json:"vip_address"`
		}
	}
	api(t, "GET", oc+"/v2/lbaas/loadbalancers/"+x.lb, nil, nil, 200, &full)
	x.vip = full.Loadbalancer.VIP
	return x
}

// noauthConfig points the provider at the testbed without Keystone.
func noauthConfig(b *testbed) openstack.Config {
	c := openstack.DefaultConfig()
	c.NoAuth = &openstack.NoAuthConfig{Neutron: b.env["NEUTRON_URL"], Nova: b.env["NOVA_URL"], Octavia: b.env["OCTAVIA_URL"]}
	return c
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newLogger(t testing.TB) (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

func newProvider(t testing.TB, cfg openstack.Config, opts ...openstack.Option) (*openstack.Provider, *prometheus.Registry, *logBuffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	log, buf := newLogger(t)
	p, err := openstack.New(cfg, log, reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, reg, buf
}

func reconcile(t testing.TB, p *openstack.Provider) *inventory.Inventory {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.Reconcile(ctx); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	inv, _ := p.Inventory()
	return inv
}

func mustMAC(t testing.TB, s string) uint64 {
	t.Helper()
	m, ok := snapshot.ParseMAC(s)
	if !ok {
		t.Fatalf("bad MAC %q", s)
	}
	return m
}

func findPort(inv *inventory.Inventory, pred func(*inventory.Port) bool) []*inventory.Port {
	var out []*inventory.Port
	for i := range inv.Ports {
		if pred(&inv.Ports[i]) {
			out = append(out, &inv.Ports[i])
		}
	}
	return out
}

// TestContractSnapshot: the snapshot built from what the provider reads
// off the real APIs attributes the topology as the domain rules say.
func TestContractSnapshot(t *testing.T) {
	b, x := needTopology(t)
	p, reg, _ := newProvider(t, noauthConfig(b))
	inv := reconcile(t, p)
	now := time.Now()
	nowUS := now.UnixMicro()
	s := snapshot.Build(inv, snapshot.Options{Version: 1, Now: now, GhostGrace: time.Minute})

	endpoint := func(m string) *snapshot.Endpoint {
		t.Helper()
		ep, ok := s.Endpoint(mustMAC(t, m), nowUS)
		if !ok {
			return nil
		}
		return ep
	}
	// VM ports -> tenants and servers
	for _, c := range []struct {
		name, mac, tenant, server, port string
		aap                             bool
	}{
		{"vm1", x.vm1MAC, x.p1, x.s1, x.vm1, false},
		{"vm2", x.vm2MAC, x.p2, x.s2, x.vm2, false},
		{"vm2 allowed-address-pair MAC", x.aapMAC, x.p2, x.s2, x.vm2, true},
		{"vm3", x.vm3MAC, x.p1, x.s3, x.vm3, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := endpoint(c.mac)
			if ep == nil {
				t.Fatalf("MAC %s not an endpoint (anomalies: %v)", c.mac, s.Anomalies())
			}
			if ep.TenantID != c.tenant || ep.ServerID != c.server || ep.PortID != c.port || ep.AAP != c.aap || ep.Amphora {
				t.Errorf("endpoint %+v, want tenant %s server %s port %s aap %v", *ep, c.tenant, c.server, c.port, c.aap)
			}
		})
	}
	// servers from Nova (all_tenants)
	servers := map[string]inventory.Server{}
	for _, sv := range inv.Servers {
		servers[sv.ID] = sv
	}
	for id, want := range map[string]string{x.s1: x.p1, x.s2: x.p2, x.s3: x.p1} {
		if sv, ok := servers[id]; !ok || sv.Project() != want || !strings.HasPrefix(sv.Name, "vm") {
			t.Errorf("server %s = %+v (present %v), want project %s", id, sv, ok, want)
		}
	}
	// router interfaces and gateway are infrastructure, not endpoints
	rports := findPort(inv, func(p *inventory.Port) bool { return p.DeviceID == x.router })
	if len(rports) != 3 {
		t.Fatalf("router ports: %d, want 2 interfaces + gateway", len(rports))
	}
	for _, rp := range rports {
		if ep := endpoint(rp.MACAddress); ep != nil {
			t.Errorf("router port %s (%s) is an endpoint: %+v", rp.ID, rp.DeviceOwner, *ep)
		}
	}
	// external network label: vm1 leaves through its floating IP's network
	if ep := endpoint(x.vm1MAC); ep == nil || ep.ExternalNetwork != x.publicName {
		t.Errorf("vm1 external network label: %+v, want %s", ep, x.publicName)
	}
	var res snapshot.Result
	in := snapshot.Input{Dir: schemas.DirTX, VMMAC: mustMAC(t, x.vm1MAC), PeerMAC: mustMAC(t, rportOn(t, rports, x.appSub).MACAddress),
		LocalIP: netip.MustParseAddr("10.0.2.10"), RemoteIP: netip.MustParseAddr("8.8.8.8"), NowUS: nowUS}
	s.Attribute(&in, &res)
	if res.Zone != schemas.ZoneExternal || res.ExternalNetwork != x.publicName || res.TenantID != x.p1 {
		t.Errorf("vm1 -> 8.8.8.8 via the router: %+v, want external/%s/%s", res, x.publicName, x.p1)
	}
	// the static route's next hop and the gateway address classify as
	// infra from P1's VM
	in.RemoteIP = netip.MustParseAddr("10.0.2.1")
	s.Attribute(&in, &res)
	if res.Zone != schemas.ZoneInfra {
		t.Errorf("vm1 -> its gateway 10.0.2.1: zone %s, want infra", res.Zone)
	}
	// the static route 10.9.0.0/16 via P1's appliance: same_tenant for P1
	in = snapshot.Input{Dir: schemas.DirTX, VMMAC: mustMAC(t, x.vm3MAC), PeerMAC: mustMAC(t, rportOn(t, rports, x.webSub).MACAddress),
		LocalIP: netip.MustParseAddr("10.0.1.11"), RemoteIP: netip.MustParseAddr("10.9.1.1"), NowUS: nowUS}
	s.Attribute(&in, &res)
	if res.Zone != schemas.ZoneSameTenant {
		t.Errorf("vm3 -> 10.9.1.1 (static route via P1's appliance): zone %s, want same_tenant", res.Zone)
	}
	if !slices.ContainsFunc(inv.Routers, func(r inventory.Router) bool {
		return r.ID == x.router && len(r.Routes) == 1 && r.Routes[0].NextHop == "10.0.2.50" && r.GatewayNetworkID() == x.publicNet
	}) {
		t.Errorf("router %s: routes or gateway not read", x.router)
	}

	// the amphora join: data ports (VRRP on web, plug on app) bill P1,
	// management ports do not
	var amps []inventory.Amphora
	for _, a := range inv.Amphorae {
		if a.LoadBalancerID == x.lb {
			amps = append(amps, a)
		}
	}
	if len(amps) != 2 {
		t.Fatalf("amphorae of %s: %d, want 2 (ACTIVE_STANDBY)", x.lb, len(amps))
	}
	roles := []string{amps[0].Role, amps[1].Role}
	slices.Sort(roles)
	if !slices.Equal(roles, []string{"BACKUP", "MASTER"}) {
		t.Errorf("amphora roles %v", roles)
	}
	for _, a := range amps {
		ports := findPort(inv, func(p *inventory.Port) bool { return p.DeviceID == a.ComputeID })
		if len(ports) != 3 {
			t.Fatalf("amphora %s: %d ports with device_id = compute_id, want management + VRRP + member plug", a.ID, len(ports))
		}
		var data, mgmt int
		for _, pt := range ports {
			isMgmt := slices.ContainsFunc(pt.FixedIPs, func(f inventory.FixedIP) bool { return f.IPAddress == a.LBNetworkIP })
			ep := endpoint(pt.MACAddress)
			switch {
			case isMgmt:
				mgmt++
				if ep == nil || ep.Amphora || ep.TenantID == x.p1 {
					t.Errorf("management port %s: %+v, want an endpoint of the service project, not re-attributed", pt.ID, ep)
				}
			default:
				data++
				if ep == nil || !ep.Amphora || ep.TenantID != x.p1 || ep.LBID != x.lb {
					t.Errorf("data port %s (%s on %s): %+v, want amphora of %s billed to %s", pt.ID, pt.Name, pt.NetworkID, ep, x.lb, x.p1)
				}
			}
		}
		if data != 2 || mgmt != 1 {
			t.Errorf("amphora %s: %d data and %d management ports", a.ID, data, mgmt)
		}
		// segment 2: amphora base address -> member vm3, infra at both taps
		vrrp := rportByIP(t, inv, a.VRRPIP)
		in := snapshot.Input{Dir: schemas.DirTX, VMMAC: mustMAC(t, vrrp.MACAddress), PeerMAC: mustMAC(t, x.vm3MAC),
			LocalIP: netip.MustParseAddr(a.VRRPIP), RemoteIP: netip.MustParseAddr("10.0.1.11"), NowUS: nowUS}
		s.Attribute(&in, &res)
		if res.Zone != schemas.ZoneInfra || res.LBSegment != 2 || res.TenantID != x.p1 || res.LBID != x.lb {
			t.Errorf("amphora %s base -> member: %+v, want infra, segment 2, tenant %s", a.ID, res, x.p1)
		}
		// segment 1: VIP <- vm2 (P2 on the shared VIP network)
		in = snapshot.Input{Dir: schemas.DirRX, VMMAC: mustMAC(t, vrrp.MACAddress), PeerMAC: mustMAC(t, x.vm2MAC),
			LocalIP: netip.MustParseAddr(x.vip), RemoteIP: netip.MustParseAddr("10.0.1.30"), NowUS: nowUS}
		s.Attribute(&in, &res)
		if res.Zone != schemas.ZoneOtherTenant || res.LBSegment != 1 || res.TenantID != x.p1 || res.PeerTenantID != x.p2 {
			t.Errorf("amphora %s VIP <- vm2: %+v, want other_tenant, segment 1, %s billed", a.ID, res, x.p1)
		}
	}
	// the VIP port is the tenant's, not re-attributed
	vipPorts := findPort(inv, func(p *inventory.Port) bool { return p.DeviceOwner == "Octavia" && p.DeviceID == "lb-"+x.lb })
	if len(vipPorts) != 1 {
		t.Fatalf("VIP ports of %s: %d", x.lb, len(vipPorts))
	}
	if ep := endpoint(vipPorts[0].MACAddress); ep == nil || ep.TenantID != x.p1 || ep.Amphora {
		t.Errorf("VIP port: %+v, want a plain endpoint of %s", ep, x.p1)
	}
	// pools with members; the noop_driver LB skipped and counted
	if !slices.ContainsFunc(inv.Pools, func(pl inventory.Pool) bool {
		addrs := []string{}
		for _, m := range pl.Members {
			addrs = append(addrs, m.Address)
		}
		slices.Sort(addrs)
		return pl.ID == x.pool && slices.Equal(addrs, []string{"10.0.1.11", "10.0.2.10"})
	}) {
		t.Errorf("pool %s with members 10.0.1.11 and 10.0.2.10 not read: %+v", x.pool, inv.Pools)
	}
	if slices.ContainsFunc(inv.LoadBalancers, func(l inventory.LoadBalancer) bool { return l.ID == x.noopLB }) {
		t.Errorf("noop_driver load balancer %s kept", x.noopLB)
	}
	if n := metricValue(t, reg, "tapflow_inventory_skipped_loadbalancers", "provider", "noop_driver"); n < 1 {
		t.Errorf("skipped noop_driver load balancers: %v, want ≥ 1", n)
	}
	if st := s.Stats(); st.AmphoraMACs < 4 {
		t.Errorf("snapshot amphora MACs %d, want ≥ 4", st.AmphoraMACs)
	}
	if len(inv.Projects) != 0 {
		t.Errorf("noauth mode listed %d projects; Keystone is not used then", len(inv.Projects))
	}
}

func rportOn(t *testing.T, ports []*inventory.Port, subnet string) *inventory.Port {
	t.Helper()
	for _, p := range ports {
		for _, f := range p.FixedIPs {
			if f.SubnetID == subnet && strings.HasPrefix(p.DeviceOwner, "network:router_interface") {
				return p
			}
		}
	}
	t.Fatalf("no router interface on %s", subnet)
	return nil
}

func rportByIP(t *testing.T, inv *inventory.Inventory, ip string) *inventory.Port {
	t.Helper()
	ps := findPort(inv, func(p *inventory.Port) bool {
		return slices.ContainsFunc(p.FixedIPs, func(f inventory.FixedIP) bool { return f.IPAddress == ip }) && strings.HasPrefix(p.DeviceOwner, "compute:")
	})
	if len(ps) != 1 {
		t.Fatalf("compute ports with %s: %d", ip, len(ps))
	}
	return ps[0]
}

// metricValue sums the series of metric name whose labels match the
// name/value pairs given.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
