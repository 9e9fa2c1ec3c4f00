package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/internal/yamlpath"
)

// Topology is a lab topology file (deploy/lab/*.yaml, docs/lab.md): the
// OpenStack objects to model, by name. IDs, MACs and unspecified
// addresses are derived deterministically from the names.
type Topology struct {
	// Projects are Keystone project names. "admin" (owner of networks
	// without a project) and the Octavia service project are implicit.
	Projects []string      `yaml:"projects"`
	Networks []NetworkSpec `yaml:"networks"`
	Routers  []RouterSpec  `yaml:"routers"`
	Servers  []ServerSpec  `yaml:"servers"`
	// Hypervisors names compute nodes beyond the implicit first one
	// ("hv"); each is a namespace with its own bridges, linked to the
	// first one's, and its own tapflow agent (scenario live-migration).
	Hypervisors   []string       `yaml:"hypervisors"`
	LoadBalancers []LBSpec       `yaml:"loadbalancers"`
	Internet      InternetSpec   `yaml:"internet"`
	Octavia       OctaviaSpec    `yaml:"octavia"`
	lines         map[string]int // "servers[2]" → line, for errors
	file          string
}

// NetworkSpec is a Neutron network with its subnets.
type NetworkSpec struct {
	Name string `yaml:"name"`
	// Project owns the network; empty: admin.
	Project  string       `yaml:"project"`
	Shared   bool         `yaml:"shared"`
	External bool         `yaml:"external"`
	DHCP     bool         `yaml:"dhcp"` // a network:dhcp port (a namespace answering UDP 53/67) on the second address
	Subnets  []SubnetSpec `yaml:"subnets"`
}

// SubnetSpec is a subnet. Gateway defaults to the first host address;
// "none" means no gateway.
type SubnetSpec struct {
	CIDR    string `yaml:"cidr"`
	Gateway string `yaml:"gateway"`
}

// RouterSpec is a Neutron router.
type RouterSpec struct {
	Name    string `yaml:"name"`
	Project string `yaml:"project"`
	// Gateway is the external network of its external_gateway_info; empty:
	// no gateway (no SNAT, no floating IPs).
	Gateway    string            `yaml:"gateway"`
	Interfaces []RouterIfaceSpec `yaml:"interfaces"`
	Routes     []RouteSpec       `yaml:"routes"`
}

// RouterIfaceSpec attaches a router to a network: by default on each
// subnet's gateway address; Addresses overrides (a second router on a
// subnet whose gateway belongs to another one).
type RouterIfaceSpec struct {
	Network   string   `yaml:"network"`
	Addresses []string `yaml:"addresses"`
}

// UnmarshalYAML accepts a bare network name.
func (r *RouterIfaceSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		r.Network = n.Value
		return nil
	}
	type plain RouterIfaceSpec
	return strictDecode(n, (*plain)(r))
}

// RouteSpec is an extraroute (router) or an in-guest route (server).
type RouteSpec struct {
	Destination string `yaml:"destination"`
	NextHop     string `yaml:"nexthop"`
}

// ServerSpec is a Nova server.
type ServerSpec struct {
	Name    string     `yaml:"name"`
	Project string     `yaml:"project"`
	Ports   []PortSpec `yaml:"ports"`
	// Routes are in-guest routes (e.g. through a second router).
	Routes []RouteSpec `yaml:"routes"`
	// Loopback are addresses on the guest's lo, outside every subnet of
	// the topology: an appliance answering for a network behind it that
	// Neutron does not know (the target of an extraroute through it).
	Loopback []string `yaml:"loopback"`
	// Host is the hypervisor the server starts on (default: the first).
	Host string `yaml:"host"`
}

// PortSpec is a server's Neutron port.
type PortSpec struct {
	Network string `yaml:"network"`
	// IPs are fixed IPs; empty: one address from each subnet.
	IPs []string `yaml:"ips"`
	// MAC overrides the derived fa:16:3e:… MAC.
	MAC        string  `yaml:"mac"`
	FloatingIP FIPSpec `yaml:"floating_ip"`
	// Inventory false leaves the port (and its server) out of the
	// inventory file: an unknown VM, until the scenario adds it.
	Inventory *bool `yaml:"inventory"`
	// WireMAC is the MAC the guest's device really uses when it differs
	// from the port's (a VRRP virtual MAC, a spoofed MAC).
	WireMAC string `yaml:"wire_mac"`
	// AddressPairs are the port's allowed_address_pairs (mac_address
	// default: the port's MAC).
	AddressPairs []AddressPairSpec `yaml:"allowed_address_pairs"`
	// Subports make the port a trunk parent (Neutron trunk): each a port
	// of its own on another network, carried on this port's tap tagged
	// with its VLAN.
	Subports []SubportSpec `yaml:"subports"`
}

// SubportSpec is one trunk subport (segmentation_type vlan).
type SubportSpec struct {
	Network string `yaml:"network"`
	VLAN    int    `yaml:"vlan"`
	// IPs are fixed IPs (IPv4); empty: one from the network's IPv4 subnet.
	IPs []string `yaml:"ips"`
	// MAC defaults to the parent's (Neutron's default).
	MAC string `yaml:"mac"`
}

// AddressPairSpec is one allowed address pair of a port.
type AddressPairSpec struct {
	IPAddress  string `yaml:"ip_address"`
	MACAddress string `yaml:"mac_address"`
}

// FIPSpec is a floating IP: `floating_ip: public` or
// `floating_ip: {network: public, address: 203.0.113.50}`.
type FIPSpec struct {
	Network string `yaml:"network"`
	Address string `yaml:"address"`
}

// UnmarshalYAML accepts a bare network name.
func (f *FIPSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		f.Network = n.Value
		return nil
	}
	type plain FIPSpec
	return strictDecode(n, (*plain)(f))
}

// LBSpec is an Octavia load balancer (amphora provider).
type LBSpec struct {
	Name    string `yaml:"name"`
	Project string `yaml:"project"`
	VIP     struct {
		Network string `yaml:"network"`
		Address string `yaml:"address"`
	} `yaml:"vip"`
	FloatingIP FIPSpec `yaml:"floating_ip"`
	// Topology is SINGLE (default) or ACTIVE_STANDBY.
	Topology string       `yaml:"topology"`
	Listener ListenerSpec `yaml:"listener"`
	Members  []MemberSpec `yaml:"members"`
}

// ListenerSpec is the LB's one listener.
type ListenerSpec struct {
	Protocol string `yaml:"protocol"` // HTTP (default) or TCP
	Port     int    `yaml:"port"`     // default 80
}

// MemberSpec is a pool member: a server's address on the port given by
// Network (default: its first port).
type MemberSpec struct {
	Server  string `yaml:"server"`
	Network string `yaml:"network"`
	Port    int    `yaml:"port"` // default 8080 (the lab's HTTP server)
}

// UnmarshalYAML accepts a bare server name.
func (m *MemberSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		m.Server = n.Value
		return nil
	}
	type plain MemberSpec
	return strictDecode(n, (*plain)(m))
}

// InternetSpec is the namespace standing for the world beyond the
// external networks: it holds each external subnet's gateway address and
// the Addresses (default 198.51.100.10) on which its servers listen.
type InternetSpec struct {
	Addresses []string `yaml:"addresses"`
}

// OctaviaSpec names the Octavia service project and management network.
type OctaviaSpec struct {
	Project  string `yaml:"project"`   // default "octavia-service"
	MgmtCIDR string `yaml:"mgmt_cidr"` // default 172.31.0.0/24
}

// strictDecode decodes n into v rejecting unknown keys (Node.Decode alone
// is lenient).
func strictDecode(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		// Line numbers of the re-encoded snippet are meaningless; give the
		// node's own line.
		var te *yaml.TypeError
		if errors.As(err, &te) {
			msgs := make([]string, len(te.Errors))
			for i, m := range te.Errors {
				if j := strings.Index(m, ": "); strings.HasPrefix(m, "line ") && j > 0 {
					m = m[j+2:]
				}
				msgs[i] = fmt.Sprintf("line %d: %s", n.Line, m)
			}
			return &yaml.TypeError{Errors: msgs}
		}
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}

// LoadTopology reads and checks a topology file.
func LoadTopology(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("lab topology: %w", err)
	}
	return ParseTopology(data, path)
}

// ParseTopology decodes a topology (unknown keys are errors, with their
// line). name is used in errors. It does not resolve names; Resolve does.
func ParseTopology(data []byte, name string) (*Topology, error) {
	t := &Topology{file: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(t); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("lab topology %s:\n  %s", name, strings.Join(te.Errors, "\n  "))
		}
		return nil, fmt.Errorf("lab topology %s: %w", name, err)
	}
	t.lines = yamlpath.Lines(data)
	return t, nil
}

// where names an object for an error: "demo.yaml:23: servers[2] (web1)".
func (t *Topology) where(path, name string) string {
	s := t.file
	if l, ok := t.lines[path]; ok {
		s += ":" + strconv.Itoa(l)
	}
	s += ": " + path
	if name != "" {
		s += " (" + name + ")"
	}
	return s
}
