package openstack

import (
	"context"
	"net/url"
	"strings"
	"sync"

	"github.com/tapflow/tapflow/inventory"
)

// What each call asks for and insists on. fields= is sent to Neutron and
// Octavia (they trim the response); Nova and Keystone have no such
// parameter. A required field that is absent makes the response unusable:
// silently defaulting e.g. shared or router:external to false would
// mis-zone whole networks.
var (
	colProjects = collection{endpoint: "projects", service: "Keystone", path: "projects", key: "projects",
		required: []string{"id", "name"}}
	colNetworks = collection{endpoint: "networks", service: "Neutron", path: "networks", key: "networks", paged: true,
		fields:   []string{"id", "name", "project_id", "tenant_id", "shared", "router:external"},
		required: []string{"id", "project_id|tenant_id", "shared", "router:external"}}
	colSubnets = collection{endpoint: "subnets", service: "Neutron", path: "subnets", key: "subnets", paged: true,
		fields:   []string{"id", "name", "network_id", "project_id", "tenant_id", "cidr", "gateway_ip", "ip_version"},
		required: []string{"id", "network_id", "cidr", "gateway_ip", "ip_version"}, nullable: []string{"gateway_ip"}}
	colPorts = collection{endpoint: "ports", service: "Neutron", path: "ports", key: "ports", paged: true,
		fields: []string{"id", "name", "network_id", "project_id", "tenant_id", "mac_address", "fixed_ips",
			"allowed_address_pairs", "device_owner", "device_id", "binding:host_id"},
		required: []string{"id", "network_id", "project_id|tenant_id", "mac_address", "fixed_ips", "device_owner", "device_id"}}
	colRouters = collection{endpoint: "routers", service: "Neutron", path: "routers", key: "routers", paged: true,
		fields:   []string{"id", "name", "project_id", "tenant_id", "external_gateway_info", "routes"},
		required: []string{"id", "project_id|tenant_id", "external_gateway_info"}, nullable: []string{"external_gateway_info"}}
	colFloatingIPs = collection{endpoint: "floatingips", service: "Neutron", path: "floatingips", key: "floatingips", paged: true,
		fields: []string{"id", "floating_ip_address", "floating_network_id", "port_id", "fixed_ip_address", "router_id",
			"project_id", "tenant_id"},
		required: []string{"id", "floating_network_id", "port_id"}, nullable: []string{"port_id"}}
	colServers = collection{endpoint: "servers", service: "Nova", path: "servers/detail", key: "servers", paged: true,
		query: url.Values{"all_tenants": {"1"}}, required: []string{"id", "tenant_id|project_id"}}
	colLoadBalancers = collection{endpoint: "loadbalancers", service: "Octavia", path: "lbaas/loadbalancers", key: "loadbalancers", paged: true,
		fields: []string{"id", "name", "project_id", "tenant_id", "vip_address", "vip_port_id", "vip_subnet_id",
			"vip_network_id", "provider", "provisioning_status"},
		required: []string{"id", "project_id|tenant_id", "provider", "vip_address"}, nullable: []string{"provider"}}
	colAmphorae = collection{endpoint: "amphorae", service: "Octavia", path: "octavia/amphorae", key: "amphorae", paged: true,
		fields: []string{"id", "loadbalancer_id", "compute_id", "lb_network_ip", "vrrp_ip", "ha_ip", "vrrp_port_id",
			"ha_port_id", "role", "status"},
		required: []string{"id", "loadbalancer_id", "compute_id", "lb_network_ip", "status"},
		nullable: []string{"loadbalancer_id", "compute_id", "lb_network_ip"}}
	colPools = collection{endpoint: "pools", service: "Octavia", path: "lbaas/pools", key: "pools", paged: true,
		fields:   []string{"id", "name", "project_id", "loadbalancers", "members"},
		required: []string{"id", "loadbalancers"}}
	colTrunks = collection{endpoint: "trunks", service: "Neutron", path: "trunks", key: "trunks", paged: true,
		fields:   []string{"id", "name", "project_id", "tenant_id", "port_id", "sub_ports"},
		required: []string{"id", "port_id", "sub_ports"}}
	colMembers = collection{endpoint: "members", service: "Octavia", key: "members", paged: true,
		fields:   []string{"id", "name", "address", "protocol_port", "subnet_id", "project_id"},
		required: []string{"id", "address"}}
)

// amphoraProvider reports whether an LB's provider runs amphorae: amphora,
// its deprecated alias octavia, or empty (the default provider).
func amphoraProvider(p string) bool {
	p = strings.ToLower(p)
	return p == "" || p == "amphora" || p == "octavia"
}

// fetchMembers fills every pool's members from GET /pools/{id}/members,
// at most MembersConcurrency at a time; the first error wins.
func (p *Provider) fetchMembers(ctx context.Context, c *clients, pools []inventory.Pool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, p.cfg.MembersConcurrency)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := range pools {
		if len(pools[i].Members) == 0 {
			continue // the pool list names its members; none: nothing to ask
		}
		wg.Add(1)
		go func(pl *inventory.Pool) {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			col := colMembers
			col.path = "lbaas/pools/" + url.PathEscape(pl.ID) + "/members"
			ms, err := list[inventory.Member](ctx, p, c.loadBalancer, col)
			if err != nil {
				once.Do(func() { first = err; cancel() })
				return
			}
			pl.Members = ms
		}(&pools[i])
	}
	wg.Wait()
	return first
}
