package inventory

// Inventory is everything attribution reads from OpenStack. The zero value is
// an empty cloud.
type Inventory struct {
	Projects      []Project      `yaml:"projects" json:"projects"`
	Networks      []Network      `yaml:"networks" json:"networks"`
	Subnets       []Subnet       `yaml:"subnets" json:"subnets"`
	Ports         []Port         `yaml:"ports" json:"ports"`
	Routers       []Router       `yaml:"routers" json:"routers"`
	FloatingIPs   []FloatingIP   `yaml:"floatingips" json:"floatingips"`
	Servers       []Server       `yaml:"servers" json:"servers"`
	LoadBalancers []LoadBalancer `yaml:"loadbalancers" json:"loadbalancers"`
	Amphorae      []Amphora      `yaml:"amphorae" json:"amphorae"`
	Pools         []Pool         `yaml:"pools" json:"pools"`
	Trunks        []Trunk        `yaml:"trunks" json:"trunks"`
}

// Trunk is a Neutron trunk (GET /v2.0/trunks): a parent port whose VM
// sends its subports' traffic tagged on the parent's tap.
type Trunk struct {
	ID        string    `yaml:"id" json:"id"`
	Name      string    `yaml:"name" json:"name"`
	ProjectID string    `yaml:"project_id" json:"project_id"`
	PortID    string    `yaml:"port_id" json:"port_id"` // the parent port
	SubPorts  []SubPort `yaml:"sub_ports" json:"sub_ports"`
}

// SubPort is one trunk subport: a port of its own (network, MAC, fixed
// IPs — by default the parent's MAC) whose frames carry segmentation_id as
// their 802.1Q VLAN on the parent's tap.
type SubPort struct {
	SegmentationType string `yaml:"segmentation_type" json:"segmentation_type"` // vlan (the only type attributed)
	SegmentationID   int    `yaml:"segmentation_id" json:"segmentation_id"`
	PortID           string `yaml:"port_id" json:"port_id"`
}

// Project is a Keystone project (GET /v3/projects).
type Project struct {
	ID   string `yaml:"id" json:"id"`
	Name string `yaml:"name" json:"name"`
}

// Network is a Neutron network (GET /v2.0/networks).
type Network struct {
	ID        string `yaml:"id" json:"id"`
	Name      string `yaml:"name" json:"name"`
	ProjectID string `yaml:"project_id" json:"project_id"`
	// TenantID is the pre-project_id name of ProjectID; used when
	// ProjectID is empty.
	TenantID string `yaml:"tenant_id" json:"tenant_id"`
	Shared   bool   `yaml:"shared" json:"shared"`
	External bool   `yaml:"router:external" json:"router:external"`
}

// Project returns project_id, falling back to tenant_id.
func (n *Network) Project() string { return orTenant(n.ProjectID, n.TenantID) }

// Subnet is a Neutron subnet (GET /v2.0/subnets).
type Subnet struct {
	ID        string `yaml:"id" json:"id"`
	Name      string `yaml:"name" json:"name"`
	NetworkID string `yaml:"network_id" json:"network_id"`
	ProjectID string `yaml:"project_id" json:"project_id"`
	TenantID  string `yaml:"tenant_id" json:"tenant_id"`
	CIDR      string `yaml:"cidr" json:"cidr"`
	GatewayIP string `yaml:"gateway_ip" json:"gateway_ip"`
	IPVersion int    `yaml:"ip_version" json:"ip_version"`
}

// Project returns project_id, falling back to tenant_id.
func (s *Subnet) Project() string { return orTenant(s.ProjectID, s.TenantID) }

// FixedIP is one entry of a port's fixed_ips.
type FixedIP struct {
	SubnetID  string `yaml:"subnet_id" json:"subnet_id"`
	IPAddress string `yaml:"ip_address" json:"ip_address"`
}

// AddressPair is one entry of a port's allowed_address_pairs. MACAddress
// is empty when the pair uses the port's own MAC.
type AddressPair struct {
	IPAddress  string `yaml:"ip_address" json:"ip_address"`
	MACAddress string `yaml:"mac_address" json:"mac_address"`
}

// Port is a Neutron port (GET /v2.0/ports).
type Port struct {
	ID                  string        `yaml:"id" json:"id"`
	Name                string        `yaml:"name" json:"name"`
	NetworkID           string        `yaml:"network_id" json:"network_id"`
	ProjectID           string        `yaml:"project_id" json:"project_id"`
	TenantID            string        `yaml:"tenant_id" json:"tenant_id"`
	MACAddress          string        `yaml:"mac_address" json:"mac_address"`
	FixedIPs            []FixedIP     `yaml:"fixed_ips" json:"fixed_ips"`
	AllowedAddressPairs []AddressPair `yaml:"allowed_address_pairs" json:"allowed_address_pairs"`
	DeviceOwner         string        `yaml:"device_owner" json:"device_owner"`
	DeviceID            string        `yaml:"device_id" json:"device_id"`
	// BindingHostID is the compute node the port is bound to (Neutron's
	// binding:host_id, admin only; "" when unbound or not fetched). Only
	// node-scoped views (enrich/nodeview) read it.
	BindingHostID string `yaml:"binding:host_id" json:"binding:host_id"`
}

// Project returns project_id, falling back to tenant_id.
func (p *Port) Project() string { return orTenant(p.ProjectID, p.TenantID) }

// ExternalFixedIP is one address of a router's external gateway.
type ExternalFixedIP struct {
	SubnetID  string `yaml:"subnet_id" json:"subnet_id"`
	IPAddress string `yaml:"ip_address" json:"ip_address"`
}

// GatewayInfo is a router's external_gateway_info.
type GatewayInfo struct {
	NetworkID        string            `yaml:"network_id" json:"network_id"`
	ExternalFixedIPs []ExternalFixedIP `yaml:"external_fixed_ips" json:"external_fixed_ips"`
}

// Route is one extraroute of a router.
type Route struct {
	Destination string `yaml:"destination" json:"destination"`
	NextHop     string `yaml:"nexthop" json:"nexthop"`
}

// Router is a Neutron router (GET /v2.0/routers). Its interfaces are the
// ports whose device_id is the router's id.
type Router struct {
	ID                  string       `yaml:"id" json:"id"`
	Name                string       `yaml:"name" json:"name"`
	ProjectID           string       `yaml:"project_id" json:"project_id"`
	TenantID            string       `yaml:"tenant_id" json:"tenant_id"`
	ExternalGatewayInfo *GatewayInfo `yaml:"external_gateway_info" json:"external_gateway_info"`
	Routes              []Route      `yaml:"routes" json:"routes"`
}

// Project returns project_id, falling back to tenant_id.
func (r *Router) Project() string { return orTenant(r.ProjectID, r.TenantID) }

// GatewayNetworkID is the external gateway's network, or "".
func (r *Router) GatewayNetworkID() string {
	if r.ExternalGatewayInfo == nil {
		return ""
	}
	return r.ExternalGatewayInfo.NetworkID
}

// FloatingIP is a Neutron floating IP (GET /v2.0/floatingips).
type FloatingIP struct {
	ID                string `yaml:"id" json:"id"`
	FloatingIPAddress string `yaml:"floating_ip_address" json:"floating_ip_address"`
	FloatingNetworkID string `yaml:"floating_network_id" json:"floating_network_id"`
	PortID            string `yaml:"port_id" json:"port_id"`
	FixedIPAddress    string `yaml:"fixed_ip_address" json:"fixed_ip_address"`
	RouterID          string `yaml:"router_id" json:"router_id"`
	ProjectID         string `yaml:"project_id" json:"project_id"`
	TenantID          string `yaml:"tenant_id" json:"tenant_id"`
}

// Server is a Nova server (GET /servers/detail?all_tenants=1). Nova calls
// the project tenant_id.
type Server struct {
	ID        string `yaml:"id" json:"id"`
	Name      string `yaml:"name" json:"name"`
	ProjectID string `yaml:"project_id" json:"project_id"`
	TenantID  string `yaml:"tenant_id" json:"tenant_id"`
}

// Project returns project_id, falling back to tenant_id.
func (s *Server) Project() string { return orTenant(s.ProjectID, s.TenantID) }

// LoadBalancer is an Octavia load balancer (GET /v2/lbaas/loadbalancers).
type LoadBalancer struct {
	ID                 string `yaml:"id" json:"id"`
	Name               string `yaml:"name" json:"name"`
	ProjectID          string `yaml:"project_id" json:"project_id"`
	TenantID           string `yaml:"tenant_id" json:"tenant_id"`
	VIPAddress         string `yaml:"vip_address" json:"vip_address"`
	VIPPortID          string `yaml:"vip_port_id" json:"vip_port_id"`
	VIPSubnetID        string `yaml:"vip_subnet_id" json:"vip_subnet_id"`
	VIPNetworkID       string `yaml:"vip_network_id" json:"vip_network_id"`
	Provider           string `yaml:"provider" json:"provider"`
	ProvisioningStatus string `yaml:"provisioning_status" json:"provisioning_status"`
}

// Project returns project_id, falling back to tenant_id.
func (l *LoadBalancer) Project() string { return orTenant(l.ProjectID, l.TenantID) }

// Amphora is an Octavia amphora (GET /v2/octavia/amphorae, admin only).
type Amphora struct {
	ID             string `yaml:"id" json:"id"`
	LoadBalancerID string `yaml:"loadbalancer_id" json:"loadbalancer_id"`
	// ComputeID is the Nova instance; the amphora's ports are the ports
	// whose device_id equals it.
	ComputeID string `yaml:"compute_id" json:"compute_id"`
	// LBNetworkIP is the management address; the port holding it is the
	// management port and is never re-attributed.
	LBNetworkIP string `yaml:"lb_network_ip" json:"lb_network_ip"`
	VRRPIP      string `yaml:"vrrp_ip" json:"vrrp_ip"`
	HAIP        string `yaml:"ha_ip" json:"ha_ip"`
	VRRPPortID  string `yaml:"vrrp_port_id" json:"vrrp_port_id"`
	HAPortID    string `yaml:"ha_port_id" json:"ha_port_id"`
	Role        string `yaml:"role" json:"role"`
	Status      string `yaml:"status" json:"status"`
}

// Member is a pool member (GET /v2/lbaas/pools/{id}/members), listed inside
// its pool's members.
type Member struct {
	ID           string `yaml:"id" json:"id"`
	Name         string `yaml:"name" json:"name"`
	Address      string `yaml:"address" json:"address"`
	ProtocolPort int    `yaml:"protocol_port" json:"protocol_port"`
	SubnetID     string `yaml:"subnet_id" json:"subnet_id"`
	ProjectID    string `yaml:"project_id" json:"project_id"`
}

// LoadBalancerRef is one entry of a pool's loadbalancers.
type LoadBalancerRef struct {
	ID string `yaml:"id" json:"id"`
}

// Pool is an Octavia pool (GET /v2/lbaas/pools) with its members inlined.
type Pool struct {
	ID            string            `yaml:"id" json:"id"`
	Name          string            `yaml:"name" json:"name"`
	ProjectID     string            `yaml:"project_id" json:"project_id"`
	LoadBalancers []LoadBalancerRef `yaml:"loadbalancers" json:"loadbalancers"`
	Members       []Member          `yaml:"members" json:"members"`
}

func orTenant(project, tenant string) string {
	if project != "" {
		return project
	}
	return tenant
}
