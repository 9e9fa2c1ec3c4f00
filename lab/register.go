package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	testbed "github.com/tapflow/tapflow/deploy/openstack-testbed"
	"github.com/tapflow/tapflow/internal/fsx"
)

// RegisterOptions make Up create the cloud's objects in a real OpenStack
// (Keystone, Neutron, Octavia and, on the testbed, Nova) before it builds
// the namespaces, and build the namespaces with the IDs, MACs and
// addresses OpenStack gave back. tapflow then reads its inventory from
// those APIs (inventory.provider openstack) instead of the lab's file.
type RegisterOptions struct {
	// AuthURL is Keystone's v3 URL. The credentials come from the usual
	// OS_* variables: OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME,
	// OS_USER_DOMAIN_ID (or _NAME), OS_PROJECT_DOMAIN_ID (or _NAME),
	// OS_REGION_NAME and OS_INTERFACE (default internal). The user needs
	// the admin role: the lab sets MACs, project_id and provider networks.
	AuthURL string
	// NovaConf is the testbed's nova.conf (deploy/openstack-testbed): its
	// nova-api cannot boot servers, so they are written through Nova's
	// objects. Empty: no Nova servers are created (a real cloud would boot
	// real VMs); records then carry server_id without a server name.
	NovaConf string
	// Getenv reads the OS_* variables (default os.Getenv).
	Getenv func(string) string
}

// Registration is what `lab up --register` created in OpenStack, kept in
// the lab's state: how each object the topology derives maps to its
// OpenStack counterpart, and what `lab down` must delete. No secret is
// kept here.
type Registration struct {
	AuthURL   string `yaml:"auth_url"`
	Region    string `yaml:"region,omitempty"`
	Interface string `yaml:"interface"`
	// IDs maps a lab-derived id (network, subnet, router, port, project,
	// load balancer, pool, member, amphora, floating IP) to OpenStack's.
	IDs map[string]string `yaml:"ids"`
	// Ports are the ports whose MAC or addresses OpenStack chose.
	Ports map[string]BoundPort `yaml:"ports,omitempty"`
	// Amphorae maps a lab amphora id to Octavia's view of it.
	Amphorae map[string]BoundAmphora `yaml:"amphorae,omitempty"`
	// Endpoints are the API servers' host:port (Keystone and the catalog's
	// Neutron, Nova, Octavia): loopback ones are forwarded into the
	// hypervisor namespace, where tapflow runs.
	Endpoints []string `yaml:"endpoints"`
	// Created lists what to delete, in creation order.
	Created []Created `yaml:"created"`
}

// BoundPort is a port as Neutron made it.
type BoundPort struct {
	ID  string   `yaml:"id"`
	MAC string   `yaml:"mac"`
	IPs []string `yaml:"ips"`
}

// BoundAmphora is an amphora as Octavia made it.
type BoundAmphora struct {
	ID        string `yaml:"id"`
	ComputeID string `yaml:"compute_id"`
	Role      string `yaml:"role"`
}

// Created is one object `lab down` deletes.
type Created struct {
	Kind   string `yaml:"kind"` // project, network, port, router, router_interface, floatingip, loadbalancer, flavor, flavorprofile
	ID     string `yaml:"id"`
	Parent string `yaml:"parent,omitempty"` // router of a router_interface
	Name   string `yaml:"name,omitempty"`
}

// registrar creates a Cloud's objects.
type registrar struct {
	api  *osAPI
	c    *Cloud
	reg  *Registration
	save func() error
	log  *slog.Logger
}

// id is the OpenStack id of a lab-derived id (itself when not registered).
func (r *registrar) id(labID string) string {
	if v, ok := r.reg.IDs[labID]; ok {
		return v
	}
	if b, ok := r.reg.Ports[labID]; ok {
		return b.ID
	}
	return labID
}

func (r *registrar) created(kind, id, parent, name string) error {
	r.reg.Created = append(r.reg.Created, Created{Kind: kind, ID: id, Parent: parent, Name: name})
	return r.save()
}

type neutronPort struct {
	ID          string `json:"id"`
	NetworkID   string `json:"network_id"`
	MAC         string `json:"mac_address"`
	ProjectID   string `json:"project_id"`
	DeviceOwner string `json:"device_owner"`
	DeviceID    string `json:"device_id"`
	FixedIPs    []struct {
		SubnetID  string `json:"subnet_id"`
		IPAddress string `json:"ip_address"`
	} `json:"fixed_ips"`
}

func (p neutronPort) bound() BoundPort {
	b := BoundPort{ID: p.ID, MAC: p.MAC}
	for _, ip := range p.FixedIPs {
		b.IPs = append(b.IPs, ip.IPAddress)
	}
	return b
}

func (r *registrar) ports(ctx context.Context, q url.Values) ([]neutronPort, error) {
	var out struct {
		Ports []neutronPort `json:"ports"`
	}
	if err := call(ctx, r.api.neutron, "GET", "ports?"+q.Encode(), nil, nil, &out, 200); err != nil {
		return nil, err
	}
	return out.Ports, nil
}

func (r *registrar) fixedIPs(p *Port) []map[string]string {
	var out []map[string]string
	for _, a := range p.IPs {
		out = append(out, map[string]string{"subnet_id": r.id(a.Subnet.ID), "ip_address": a.Addr.String()})
	}
	return out
}

// neutronCreate POSTs body as one Neutron kind (port, network, subnet,
// router) and decodes the object into into. A server error is checked
// with GET <kind>s?unique (the values that identify the object) and the
// object adopted when exactly one was made, else posted again
// (postRetrying): a loaded Neutron on SQLite answers 500 now and then.
func (r *registrar) neutronCreate(ctx context.Context, kind string, body map[string]any, unique url.Values, into any) error {
	var one map[string]json.RawMessage
	var found json.RawMessage
	post := func() error {
		return call(ctx, r.api.neutron, "POST", kind+"s", nil, map[string]any{kind: body}, &one, 201)
	}
	find := func() (bool, error) {
		var many map[string][]json.RawMessage
		if err := call(ctx, r.api.neutron, "GET", kind+"s?"+unique.Encode(), nil, nil, &many, 200); err != nil {
			return false, err
		}
		if l := many[kind+"s"]; len(l) == 1 {
			found = l[0]
			return true, nil
		}
		return false, nil
	}
	if err := postRetrying(ctx, r.log, kind, post, find); err != nil {
		return err
	}
	raw := found
	if raw == nil {
		raw = one[kind]
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("decode the created %s: %w", kind, err)
	}
	return nil
}

// createPort creates p in Neutron with its MAC and addresses.
func (r *registrar) createPort(ctx context.Context, p *Port, owner, deviceID string) (neutronPort, error) {
	body := map[string]any{"name": p.Name, "network_id": r.id(p.Net.ID), "mac_address": p.MAC.String(),
		"fixed_ips": r.fixedIPs(p), "device_owner": owner, "device_id": deviceID}
	if p.Project != nil {
		body["project_id"] = r.id(p.Project.ID)
	}
	var out struct {
		Port neutronPort `json:"port"`
	}
	unique := url.Values{"network_id": {r.id(p.Net.ID)}, "mac_address": {p.MAC.String()}}
	if err := r.neutronCreate(ctx, "port", body, unique, &out.Port); err != nil {
		return neutronPort{}, fmt.Errorf("register: create port %s: %w", portLabel(p), err)
	}
	r.reg.IDs[p.ID] = out.Port.ID
	return out.Port, r.created("port", out.Port.ID, "", portLabel(p))
}

func portLabel(p *Port) string {
	if p.Name != "" {
		return p.Name
	}
	return p.Owner + "/" + p.Net.Name
}

// Register creates the lab's objects in OpenStack (see RegisterOptions).
// Every object is recorded in reg as soon as it exists, and save is called,
// so `lab down` can delete what a crashed or failed run left.
func (c *Cloud) register(ctx context.Context, api *osAPI, reg *Registration, save func() error, log *slog.Logger, novaConf, stateDir string) error {
	r := &registrar{api: api, c: c, reg: reg, save: save, log: log}
	if len(c.LBs) > 0 && api.octavia == nil {
		return errors.New("register: the topology has load balancers but Keystone's catalog has no load-balancer (Octavia) endpoint")
	}
	steps := []struct {
		what string
		f    func(context.Context) error
	}{
		{"projects", r.projects},
		{"networks", r.networks},
		{"routers", r.routers},
		{"ports", r.instancePorts},
		{"load balancers", r.loadBalancers},
		{"floating IPs", r.floatingIPs},
		{"servers", func(ctx context.Context) error { return r.servers(ctx, novaConf, stateDir) }},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.f(ctx); err != nil {
			return err
		}
		log.Info("registered", "what", s.what, "took", time.Since(t).Round(time.Millisecond))
	}
	return nil
}

func (r *registrar) projects(ctx context.Context) error {
	for _, p := range r.c.Projects {
		switch {
		case p.Name == AdminProject:
			r.reg.IDs[p.ID] = r.api.adminProject
			continue
		case p == r.c.ServiceProject:
			continue // Octavia's own: learnt from the amphorae
		}
		name := r.c.Prefix + "-" + p.Name
		var out struct {
			Project struct {
				ID string `json:"id"`
			} `json:"project"`
		}
		err := call(ctx, r.api.keystone, "POST", "projects", nil, map[string]any{"project": map[string]any{
			"name": name, "domain_id": "default", "description": "tapflow lab " + r.c.Prefix}}, &out, 201)
		if err != nil {
			return fmt.Errorf("register: create Keystone project %s: %w (a project of that name left by an earlier lab? delete it or use another --prefix)", name, err)
		}
		r.reg.IDs[p.ID] = out.Project.ID
		if err := r.created("project", out.Project.ID, "", name); err != nil {
			return err
		}
	}
	return nil
}

func (r *registrar) networks(ctx context.Context) error {
	for _, n := range r.c.Networks {
		if n == r.c.MgmtNet {
			continue // Octavia's amp_boot_network_list: learnt from the amphorae
		}
		// Names as in the topology (Neutron names need not be unique; the
		// external network's name is what records carry).
		body := map[string]any{"name": n.Name, "project_id": r.id(n.Project.ID), "shared": n.Shared}
		if n.External {
			// A flat network needs a physical network of its own.
			body["router:external"] = true
			body["provider:network_type"] = "flat"
			body["provider:physical_network"] = r.c.Prefix + "-" + n.Name
		}
		var out struct {
			Network struct {
				ID string `json:"id"`
			} `json:"network"`
		}
		unique := url.Values{"name": {n.Name}, "project_id": {r.id(n.Project.ID)}}
		if err := r.neutronCreate(ctx, "network", body, unique, &out.Network); err != nil {
			return fmt.Errorf("register: create network %s: %w", n.Name, err)
		}
		r.reg.IDs[n.ID] = out.Network.ID
		if err := r.created("network", out.Network.ID, "", n.Name); err != nil {
			return err
		}
		for i, sn := range n.Subnets {
			sb := map[string]any{"name": fmt.Sprintf("%s-%d", n.Name, i), "network_id": out.Network.ID,
				"project_id": r.id(n.Project.ID), "cidr": sn.Prefix.String(), "ip_version": 4, "enable_dhcp": false}
			if sn.Prefix.Addr().Is6() {
				sb["ip_version"] = 6
			}
			if sn.Gateway.IsValid() {
				sb["gateway_ip"] = sn.Gateway.String()
			} else {
				sb["gateway_ip"] = nil
			}
			var so struct {
				Subnet struct {
					ID string `json:"id"`
				} `json:"subnet"`
			}
			unique := url.Values{"network_id": {out.Network.ID}, "cidr": {sn.Prefix.String()}}
			if err := r.neutronCreate(ctx, "subnet", sb, unique, &so.Subnet); err != nil {
				return fmt.Errorf("register: create subnet %s of %s: %w", sn.Prefix, n.Name, err)
			}
			r.reg.IDs[sn.ID] = so.Subnet.ID // deleted with its network
		}
	}
	return nil
}

func (r *registrar) routers(ctx context.Context) error {
	for _, rt := range r.c.Routers {
		body := map[string]any{"name": rt.Name, "project_id": r.id(rt.Project.ID)}
		if rt.Gateway != nil {
			gi := map[string]any{"network_id": r.id(rt.Gateway.ID), "external_fixed_ips": r.fixedIPs(rt.GwPort)}
			body["external_gateway_info"] = gi
		}
		var out struct {
			Router struct {
				ID string `json:"id"`
			} `json:"router"`
		}
		unique := url.Values{"name": {rt.Name}, "project_id": {r.id(rt.Project.ID)}}
		if err := r.neutronCreate(ctx, "router", body, unique, &out.Router); err != nil {
			return fmt.Errorf("register: create router %s: %w", rt.Name, err)
		}
		rid := out.Router.ID
		r.reg.IDs[rt.ID] = rid
		if err := r.created("router", rid, "", rt.Name); err != nil {
			return err
		}
		if rt.GwPort != nil {
			// Neutron makes the gateway port: its id and MAC are Neutron's.
			ps, err := r.ports(ctx, url.Values{"device_id": {rid}, "device_owner": {"network:router_gateway"}})
			if err != nil || len(ps) != 1 {
				return fmt.Errorf("register: router %s: its gateway port not found (%d ports, %v)", rt.Name, len(ps), err)
			}
			r.reg.Ports[rt.GwPort.ID] = ps[0].bound()
		}
		for _, p := range rt.Ifaces {
			// add_router_interface sets device_owner and device_id.
			np, err := r.createPort(ctx, p, "", "")
			if err != nil {
				return err
			}
			if err := call(ctx, r.api.neutron, "PUT", "routers/"+rid+"/add_router_interface", nil,
				map[string]any{"port_id": np.ID}, nil, 200); err != nil {
				return fmt.Errorf("register: router %s: add interface on %s: %w", rt.Name, p.Net.Name, err)
			}
			if err := r.created("router_interface", np.ID, rid, rt.Name+"/"+p.Net.Name); err != nil {
				return err
			}
		}
		if len(rt.Routes) > 0 {
			var routes []map[string]string
			for _, ro := range rt.Routes {
				routes = append(routes, map[string]string{"destination": ro.Dst.String(), "nexthop": ro.NextHop.String()})
			}
			if err := call(ctx, r.api.neutron, "PUT", "routers/"+rid, nil, map[string]any{"router": map[string]any{"routes": routes}}, nil, 200); err != nil {
				return fmt.Errorf("register: router %s: routes: %w", rt.Name, err)
			}
		}
	}
	return nil
}

// instancePorts creates the VM and DHCP ports (those the inventory lists:
// a port with `inventory: false` stays unknown to OpenStack too).
func (r *registrar) instancePorts(ctx context.Context) error {
	for _, n := range r.c.Networks {
		if n.DHCP != nil {
			if _, err := r.createPort(ctx, n.DHCP, n.DHCP.Owner, n.DHCP.DeviceID); err != nil {
				return err
			}
		}
	}
	for _, s := range r.c.Servers {
		// A fresh server id per registration: Nova never reuses one, and
		// the testbed keeps servers of earlier labs.
		r.reg.IDs[s.ID] = newUUID()
		for _, p := range s.Ports {
			if !p.Inventory {
				continue
			}
			if _, err := r.createPort(ctx, p, p.Owner, r.id(s.ID)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *registrar) floatingIPs(ctx context.Context) error {
	for _, f := range r.c.FIPs {
		if !f.Port.Inventory {
			continue
		}
		body := map[string]any{"floating_network_id": r.id(f.Net.ID), "floating_ip_address": f.Holder.V4().String(),
			"port_id": r.id(f.Port.ID), "project_id": r.id(f.Port.Project.ID)}
		body["fixed_ip_address"] = f.Port.V4().String()
		var out struct {
			FloatingIP struct {
				ID string `json:"id"`
			} `json:"floatingip"`
		}
		post := func() error {
			return call(ctx, r.api.neutron, "POST", "floatingips", nil, map[string]any{"floatingip": body}, &out, 201)
		}
		// The address is unique on its network: it tells whether a create
		// answered with a 500 was made after all.
		find := func() (bool, error) {
			var got struct {
				FloatingIPs []struct {
					ID string `json:"id"`
				} `json:"floatingips"`
			}
			q := url.Values{"floating_ip_address": {f.Holder.V4().String()}, "floating_network_id": {r.id(f.Net.ID)}}
			if err := call(ctx, r.api.neutron, "GET", "floatingips?"+q.Encode(), nil, nil, &got, 200); err != nil {
				return false, err
			}
			if len(got.FloatingIPs) == 1 {
				out.FloatingIP.ID = got.FloatingIPs[0].ID
				return true, nil
			}
			return false, nil
		}
		if err := postRetrying(ctx, r.log, "floating IP "+f.Holder.V4().String(), post, find); err != nil {
			return fmt.Errorf("register: create floating IP %s for %s: %w", f.Holder.V4(), portLabel(f.Port), err)
		}
		r.reg.IDs[f.ID] = out.FloatingIP.ID
		if err := r.created("floatingip", out.FloatingIP.ID, "", f.Holder.V4().String()); err != nil {
			return err
		}
		ps, err := r.ports(ctx, url.Values{"device_id": {out.FloatingIP.ID}, "device_owner": {"network:floatingip"}})
		if err == nil && len(ps) == 1 {
			r.reg.Ports[f.Holder.ID] = ps[0].bound()
		}
	}
	return nil
}

// servers writes the Nova servers on the testbed (see RegisterOptions.NovaConf).
func (r *registrar) servers(ctx context.Context, novaConf, stateDir string) error {
	if novaConf == "" {
		r.log.Info("register: no Nova servers created (no --nova-conf; POST /servers would boot real VMs); records carry server_id without a name")
		return nil
	}
	script := filepath.Join(stateDir, "nova_servers.py")
	if err := os.WriteFile(script, testbed.NovaServersPy, 0o644); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	args := []string{script, novaConf}
	for _, s := range r.c.Servers {
		p := s.Ports[0]
		if !p.Inventory {
			continue
		}
		spec := []string{r.id(s.ID), s.Name, r.id(s.Project.ID), r.id(p.ID), r.macOf(p), p.V4().String()}
		if p.FIP != nil {
			spec = append(spec, p.FIP.Holder.V4().String())
		}
		args = append(args, strings.Join(spec, ","))
	}
	if len(args) == 2 {
		return nil
	}
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("register: Nova servers through %s: %w: %s", novaConf, err, tail(out, 10))
	}
	return nil
}

func (r *registrar) macOf(p *Port) string {
	if b, ok := r.reg.Ports[p.ID]; ok {
		return b.MAC
	}
	return p.MAC.String()
}

// octaviaLB is what the lab reads back of a load balancer.
type octaviaLB struct {
	ID                 string `json:"id"`
	ProvisioningStatus string `json:"provisioning_status"`
	VIPPortID          string `json:"vip_port_id"`
	VIPAddress         string `json:"vip_address"`
}

// octaviaAmphora is what the lab reads back of an amphora.
type octaviaAmphora struct {
	ID           string `json:"id"`
	ComputeID    string `json:"compute_id"`
	Role         string `json:"role"`
	VRRPPortID   string `json:"vrrp_port_id"`
	LBNetworkIP  string `json:"lb_network_ip"`
	Status       string `json:"status"`
	LoadBalancer string `json:"loadbalancer_id"`
}

func (r *registrar) waitLB(ctx context.Context, lb *LB, id string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var out struct {
			LB octaviaLB `json:"loadbalancer"`
		}
		if err := call(ctx, r.api.octavia, "GET", "lbaas/loadbalancers/"+id, nil, nil, &out, 200); err != nil {
			return fmt.Errorf("register: load balancer %s: %w", lb.Name, err)
		}
		switch out.LB.ProvisioningStatus {
		case "ACTIVE":
			return nil
		case "ERROR":
			return fmt.Errorf("register: load balancer %s (%s) went to ERROR; see octavia-worker's log", lb.Name, id)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("register: load balancer %s (%s) is %s after 3 min; is octavia-worker running?", lb.Name, id, out.LB.ProvisioningStatus)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// flavor returns (creating once) an Octavia flavor pinning the amphora
// topology, so an LB gets the lab's topology whatever the cloud's default.
func (r *registrar) flavor(ctx context.Context, topology string) (string, error) {
	name := r.c.Prefix + "-" + strings.ToLower(topology)
	for _, c := range r.reg.Created {
		if c.Kind == "flavor" && c.Name == name {
			return c.ID, nil
		}
	}
	var fp struct {
		FP struct {
			ID string `json:"id"`
		} `json:"flavorprofile"`
	}
	if err := call(ctx, r.api.octavia, "POST", "lbaas/flavorprofiles", nil, map[string]any{"flavorprofile": map[string]any{
		"name": name, "provider_name": "amphora", "flavor_data": fmt.Sprintf(`{"loadbalancer_topology": %q}`, topology)}}, &fp, 201); err != nil {
		return "", fmt.Errorf("register: Octavia flavor profile %s: %w", name, err)
	}
	if err := r.created("flavorprofile", fp.FP.ID, "", name); err != nil {
		return "", err
	}
	var fl struct {
		Flavor struct {
			ID string `json:"id"`
		} `json:"flavor"`
	}
	if err := call(ctx, r.api.octavia, "POST", "lbaas/flavors", nil, map[string]any{"flavor": map[string]any{
		"name": name, "flavor_profile_id": fp.FP.ID, "enabled": true}}, &fl, 201); err != nil {
		return "", fmt.Errorf("register: Octavia flavor %s: %w", name, err)
	}
	return fl.Flavor.ID, r.created("flavor", fl.Flavor.ID, "", name)
}

func (r *registrar) loadBalancers(ctx context.Context) error {
	for _, lb := range r.c.LBs {
		topo := "SINGLE"
		if lb.ActiveStandby {
			topo = "ACTIVE_STANDBY"
		}
		flavor, err := r.flavor(ctx, topo)
		if err != nil {
			return err
		}
		proj := r.id(lb.Project.ID)
		hdr := map[string]string{"X-Project-Id": proj} // noauth Octavia scopes by this header
		var out struct {
			LB octaviaLB `json:"loadbalancer"`
		}
		if err := call(ctx, r.api.octavia, "POST", "lbaas/loadbalancers", hdr, map[string]any{"loadbalancer": map[string]any{
			"name": lb.Name, "project_id": proj, "vip_subnet_id": r.id(lb.VIPSubnet.ID),
			"vip_address": lb.VIP.String(), "provider": "amphora", "flavor_id": flavor}}, &out, 201); err != nil {
			return fmt.Errorf("register: create load balancer %s: %w", lb.Name, err)
		}
		id := out.LB.ID
		r.reg.IDs[lb.ID] = id
		if err := r.created("loadbalancer", id, "", lb.Name); err != nil {
			return err
		}
		// One child at a time, each once the LB is ACTIVE again; only
		// member creation plugs the amphorae into member networks.
		if err := r.waitLB(ctx, lb, id); err != nil {
			return err
		}
		var li struct {
			Listener struct {
				ID string `json:"id"`
			} `json:"listener"`
		}
		if err := call(ctx, r.api.octavia, "POST", "lbaas/listeners", hdr, map[string]any{"listener": map[string]any{
			"name": lb.Name + "-listener", "protocol": lb.Protocol, "protocol_port": lb.ListenPort, "loadbalancer_id": id}}, &li, 201); err != nil {
			return fmt.Errorf("register: load balancer %s: listener: %w", lb.Name, err)
		}
		if err := r.waitLB(ctx, lb, id); err != nil {
			return err
		}
		var po struct {
			Pool struct {
				ID string `json:"id"`
			} `json:"pool"`
		}
		if err := call(ctx, r.api.octavia, "POST", "lbaas/pools", hdr, map[string]any{"pool": map[string]any{
			"name": lb.Name + "-pool", "protocol": lb.Protocol, "lb_algorithm": "ROUND_ROBIN", "listener_id": li.Listener.ID}}, &po, 201); err != nil {
			return fmt.Errorf("register: load balancer %s: pool: %w", lb.Name, err)
		}
		r.reg.IDs[lb.PoolID] = po.Pool.ID
		if err := r.waitLB(ctx, lb, id); err != nil {
			return err
		}
		for _, m := range lb.Members {
			var mo struct {
				Member struct {
					ID string `json:"id"`
				} `json:"member"`
			}
			if err := call(ctx, r.api.octavia, "POST", "lbaas/pools/"+po.Pool.ID+"/members", hdr, map[string]any{"member": map[string]any{
				"name": m.Server.Name, "address": m.Addr.String(), "protocol_port": m.ProtocolPort, "subnet_id": r.id(m.Subnet.ID)}}, &mo, 201); err != nil {
				return fmt.Errorf("register: load balancer %s: member %s: %w", lb.Name, m.Server.Name, err)
			}
			r.reg.IDs[m.ID] = mo.Member.ID
			if err := r.waitLB(ctx, lb, id); err != nil {
				return err
			}
		}
		if err := r.adoptAmphorae(ctx, lb, id); err != nil {
			return err
		}
	}
	return r.save()
}

// adoptAmphorae reads back what Octavia made: the VIP port, the amphorae
// and their ports (management, VRRP, member networks), and binds the lab's
// amphorae to them.
func (r *registrar) adoptAmphorae(ctx context.Context, lb *LB, id string) error {
	var got struct {
		LB octaviaLB `json:"loadbalancer"`
	}
	if err := call(ctx, r.api.octavia, "GET", "lbaas/loadbalancers/"+id, nil, nil, &got, 200); err != nil {
		return fmt.Errorf("register: load balancer %s: %w", lb.Name, err)
	}
	vip, err := r.ports(ctx, url.Values{"id": {got.LB.VIPPortID}})
	if err != nil || len(vip) != 1 {
		return fmt.Errorf("register: load balancer %s: VIP port %s not found in Neutron (%v)", lb.Name, got.LB.VIPPortID, err)
	}
	r.reg.Ports[lb.VIPPort.ID] = vip[0].bound()
	var amps struct {
		Amphorae []octaviaAmphora `json:"amphorae"`
	}
	if err := call(ctx, r.api.octavia, "GET", "octavia/amphorae?loadbalancer_id="+id, nil, nil, &amps, 200); err != nil {
		return fmt.Errorf("register: load balancer %s: amphorae: %w", lb.Name, err)
	}
	list := amps.Amphorae[:0]
	for _, a := range amps.Amphorae {
		if a.LoadBalancer == id && a.Status != "DELETED" {
			list = append(list, a)
		}
	}
	if len(list) != len(lb.Amphorae) {
		return fmt.Errorf("register: load balancer %s: Octavia made %d amphorae, the topology wants %d", lb.Name, len(list), len(lb.Amphorae))
	}
	rank := map[string]int{"MASTER": 0, "STANDALONE": 0, "BACKUP": 1}
	slices.SortFunc(list, func(a, b octaviaAmphora) int {
		return rank[a.Role] - rank[b.Role]
	})
	for k, oa := range list {
		la := lb.Amphorae[k]
		r.reg.Amphorae[la.ID] = BoundAmphora{ID: oa.ID, ComputeID: oa.ComputeID, Role: oa.Role}
		ps, err := r.ports(ctx, url.Values{"device_id": {oa.ComputeID}})
		if err != nil {
			return fmt.Errorf("register: amphora %s: %w", oa.ID, err)
		}
		for _, np := range ps {
			switch {
			case np.ID == oa.VRRPPortID:
				r.reg.Ports[la.VRRP.ID] = np.bound()
				if r.c.ServiceProject != nil {
					r.reg.IDs[r.c.ServiceProject.ID] = np.ProjectID
				}
			case len(np.FixedIPs) > 0 && np.FixedIPs[0].IPAddress == oa.LBNetworkIP:
				if err := r.adoptMgmt(ctx, np); err != nil {
					return err
				}
				r.reg.Ports[la.Mgmt.ID] = np.bound()
			default:
				for _, lp := range la.Ports[2:] {
					if r.id(lp.Net.ID) == np.NetworkID {
						r.reg.Ports[lp.ID] = np.bound()
					}
				}
			}
		}
		for _, lp := range la.Ports {
			if _, ok := r.reg.Ports[lp.ID]; !ok {
				return fmt.Errorf("register: amphora %s (%s) has no port on %s in Neutron", oa.ID, la.Name, lp.Net.Name)
			}
		}
	}
	return nil
}

// adoptMgmt binds the lab's management network to Octavia's.
func (r *registrar) adoptMgmt(ctx context.Context, np neutronPort) error {
	m := r.c.MgmtNet
	if _, ok := r.reg.IDs[m.ID]; ok {
		return nil
	}
	var out struct {
		Subnet struct {
			ID   string `json:"id"`
			CIDR string `json:"cidr"`
		} `json:"subnet"`
	}
	if err := call(ctx, r.api.neutron, "GET", "subnets/"+np.FixedIPs[0].SubnetID, nil, nil, &out, 200); err != nil {
		return fmt.Errorf("register: Octavia's management subnet: %w", err)
	}
	if out.Subnet.CIDR != m.Subnets[0].Prefix.String() {
		return fmt.Errorf("register: Octavia's management subnet is %s, the topology's %s; set octavia.mgmt_cidr: %s in the topology",
			out.Subnet.CIDR, m.Subnets[0].Prefix, out.Subnet.CIDR)
	}
	r.reg.IDs[m.ID] = np.NetworkID
	r.reg.IDs[m.Subnets[0].ID] = out.Subnet.ID
	return nil
}

// register creates the cloud in OpenStack and binds it (Up's first step
// with Options.Register). The state is saved after every object, so a
// failure or a crash leaves a record `lab down` deletes from.
func (l *Lab) register(ctx context.Context) error {
	o := *l.opts.Register
	start := time.Now()
	api, err := dialOpenStack(ctx, o)
	if err != nil {
		return err
	}
	reg := &Registration{AuthURL: o.AuthURL, Region: o.getenv("OS_REGION_NAME"), Interface: o.iface(), Endpoints: api.endpoints,
		IDs: map[string]string{}, Ports: map[string]BoundPort{}, Amphorae: map[string]BoundAmphora{}}
	l.mu.Lock()
	l.reg = reg
	l.mu.Unlock()
	clouds, err := o.cloudsYAML()
	if err != nil {
		return err
	}
	if err := fsx.WriteFile(l.CloudsPath(), clouds, fsx.PrivateFile, fsx.NoGroup); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := l.Cloud.register(ctx, api, reg, l.saveState, l.log, o.NovaConf, l.dir); err != nil {
		return err
	}
	if err := l.Cloud.Bind(reg); err != nil {
		return err
	}
	l.log.Info("lab registered in OpenStack", "keystone", o.AuthURL, "objects", len(reg.Created), "took", time.Since(start).Round(time.Millisecond))
	return l.saveState()
}

// RegisterPorts creates, in Neutron, the ports of a registered lab's
// server that were left out of OpenStack (`inventory: false`), with the
// MAC and addresses its namespace already uses, the server's project and
// device id: as a port created through the API for a VM that is already
// sending. `lab down` deletes them. Returns the ports as Neutron made them.
func (l *Lab) RegisterPorts(ctx context.Context, server string) ([]BoundPort, error) {
	if l.reg == nil || l.opts.Register == nil {
		return nil, errors.New("lab: RegisterPorts needs a lab brought up with --register")
	}
	s := l.Cloud.Server(server)
	if s == nil {
		return nil, fmt.Errorf("lab: no server %q", server)
	}
	var left []*Port
	for _, p := range s.Ports {
		if !p.Inventory {
			left = append(left, p)
		}
	}
	if len(left) == 0 {
		return nil, fmt.Errorf("lab: server %s has no port left out of OpenStack (inventory: false)", server)
	}
	api, err := dialOpenStack(ctx, *l.opts.Register)
	if err != nil {
		return nil, err
	}
	r := &registrar{api: api, c: l.Cloud, reg: l.reg, save: l.saveState, log: l.log}
	var out []BoundPort
	for _, p := range left {
		np, err := r.createPort(ctx, p, p.Owner, s.ID)
		if err != nil {
			return out, err
		}
		// The tap keeps the name it was plugged with: no id binding (Bind
		// would rename it on the next Open); Created has it for down.
		delete(l.reg.IDs, p.ID)
		p.Inventory = true
		out = append(out, np.bound())
	}
	return out, l.saveState()
}
