package openstack

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/internal/units"
)

// Config is the `inventory.openstack:` section.
//
// Credentials never appear here: they come from clouds.yaml (and its
// secure.yaml) or from the OS_* environment variables.
type Config struct {
	// Cloud is the clouds.yaml entry to use. Empty: $OS_CLOUD; when both
	// are empty the OS_* variables are used (OS_AUTH_URL with OS_USERNAME
	// and OS_PASSWORD, OS_APPLICATION_CREDENTIAL_ID/_SECRET, or OS_TOKEN).
	Cloud string `yaml:"cloud"`
	// CloudsFile is the clouds.yaml to read. Empty: the standard search
	// ($OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/,
	// /etc/openstack/).
	CloudsFile string `yaml:"clouds_file"`
	// Interface is the Keystone catalog interface the APIs are reached on:
	// internal (default), public or admin. It overrides clouds.yaml's
	// interface and $OS_INTERFACE.
	Interface string `yaml:"interface"`
	// Region picks catalog endpoints. Empty: clouds.yaml's region_name or
	// $OS_REGION_NAME; empty there too, the first endpoint of the type.
	Region string `yaml:"region"`
	// Timeout bounds each HTTP request.
	Timeout units.Duration `yaml:"timeout"`
	// PageSize is the limit= asked of APIs that paginate; every page is
	// read.
	PageSize int `yaml:"page_size"`
	// MembersConcurrency bounds the parallel GET /pools/{id}/members.
	MembersConcurrency int `yaml:"members_concurrency"`
	// NoAuth, when set, skips Keystone: the APIs are called at these
	// endpoints with a fixed token, for API servers running with
	// auth_strategy = noauth (tests, labs). Projects are not listed then.
	NoAuth *NoAuthConfig `yaml:"noauth"`

	// Refresh is how often a reconcile pass runs. It is
	// enrich.inventory.refresh, copied in by enrich.New; not read from
	// this section.
	Refresh units.Duration `yaml:"-"`
}

// NoAuthConfig are the explicit endpoints of noauth mode.
type NoAuthConfig struct {
	// Neutron is the networking endpoint, e.g. http://127.0.0.1:9696
	// (/v2.0/ is appended). Required.
	Neutron string `yaml:"neutron"`
	// Nova is the compute endpoint with its version, e.g.
	// http://127.0.0.1:8774/v2.1. Empty: no servers are listed.
	Nova string `yaml:"nova"`
	// Octavia is the load-balancer endpoint, e.g. http://127.0.0.1:9876.
	// Empty: no load balancers are listed.
	Octavia string `yaml:"octavia"`
	// Token is sent as X-Auth-Token. Nova's noauth2 reads it as
	// user:project and needs user admin for all_tenants. Default
	// admin:admin.
	Token string `yaml:"token"`
}

// DefaultConfig: internal interface, 30 s requests, pages of 1,000, 4
// parallel member lists, 5 min refresh.
func DefaultConfig() Config {
	return Config{
		Interface:          "internal",
		Timeout:            units.Duration(30 * time.Second),
		PageSize:           1000,
		MembersConcurrency: 4,
		Refresh:            units.Duration(5 * time.Minute),
	}
}

// Validate reports every invalid field as a *units.FieldError (paths
// relative to this section), joined. It reads no file and no environment:
// New does that.
func (c Config) Validate() error {
	var e units.Errors
	switch c.Interface {
	case "internal", "public", "admin":
	default:
		e.Add("interface", fmt.Sprintf("%q is not a catalog interface", c.Interface), "use internal, public or admin")
	}
	if c.Timeout.D() < 100*time.Millisecond {
		e.Add("timeout", fmt.Sprintf("%s is too short", c.Timeout), "use e.g. 30s")
	}
	if c.PageSize < 1 || c.PageSize > 10000 {
		e.Add("page_size", fmt.Sprintf("%d is outside 1..10000", c.PageSize), "use e.g. 1000")
	}
	if c.MembersConcurrency < 1 || c.MembersConcurrency > 64 {
		e.Add("members_concurrency", fmt.Sprintf("%d is outside 1..64", c.MembersConcurrency), "use e.g. 4")
	}
	if c.Refresh.D() < time.Second {
		e.Add("refresh", fmt.Sprintf("%s is too short", c.Refresh), "use at least 1s, e.g. 5m")
	}
	if n := c.NoAuth; n != nil {
		if c.Cloud != "" || c.CloudsFile != "" {
			e.Add("noauth", "set together with cloud/clouds_file", "use either noauth (explicit endpoints, no Keystone) or a clouds.yaml entry")
		}
		if n.Neutron == "" {
			e.Add("noauth.neutron", "empty", "set Neutron's URL, e.g. http://127.0.0.1:9696")
		}
		for _, f := range []struct{ path, v string }{{"noauth.neutron", n.Neutron}, {"noauth.nova", n.Nova}, {"noauth.octavia", n.Octavia}} {
			if f.v == "" {
				continue
			}
			if p := httpURLProblem(f.v); p != "" {
				e.Add(f.path, p, "use an http(s) URL, e.g. http://127.0.0.1:9696")
			}
		}
	}
	return e.Err()
}
