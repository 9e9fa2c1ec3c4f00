package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"go.yaml.in/yaml/v3"
)

// osAPI is an authenticated session with Keystone, Neutron and Octavia.
type osAPI struct {
	keystone, neutron, octavia *gophercloud.ServiceClient
	adminProject               string
	endpoints                  []string // host:port of every API reached
}

func (o RegisterOptions) getenv(k string) string {
	if o.Getenv != nil {
		return o.Getenv(k)
	}
	return os.Getenv(k)
}

// authOptions are the Keystone credentials of o, or an error naming the
// missing variable.
func (o RegisterOptions) authOptions() (gophercloud.AuthOptions, gophercloud.EndpointOpts, error) {
	var eo gophercloud.EndpointOpts
	if o.AuthURL == "" {
		return gophercloud.AuthOptions{}, eo, errors.New("register: no Keystone URL; give --register https://keystone:5000/v3")
	}
	if u, err := url.Parse(o.AuthURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return gophercloud.AuthOptions{}, eo, fmt.Errorf("register: %q is not Keystone's URL; use e.g. http://127.0.0.1:5000/v3", o.AuthURL)
	}
	var miss []string
	for _, k := range []string{"OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME"} {
		if o.getenv(k) == "" {
			miss = append(miss, k)
		}
	}
	if len(miss) > 0 {
		return gophercloud.AuthOptions{}, eo, fmt.Errorf("register: %s not set; export the admin credentials (source the testbed's env file or an openrc)", strings.Join(miss, ", "))
	}
	userDomainID, userDomainName := o.getenv("OS_USER_DOMAIN_ID"), o.getenv("OS_USER_DOMAIN_NAME")
	if userDomainID == "" && userDomainName == "" {
		userDomainID = "default"
	}
	projDomainID, projDomainName := o.getenv("OS_PROJECT_DOMAIN_ID"), o.getenv("OS_PROJECT_DOMAIN_NAME")
	if projDomainID == "" && projDomainName == "" {
		projDomainID = "default"
	}
	ao := gophercloud.AuthOptions{
		IdentityEndpoint: o.AuthURL, Username: o.getenv("OS_USERNAME"), Password: o.getenv("OS_PASSWORD"),
		DomainID: userDomainID, DomainName: userDomainName, AllowReauth: true,
		Scope: &gophercloud.AuthScope{ProjectName: o.getenv("OS_PROJECT_NAME"), DomainID: projDomainID, DomainName: projDomainName},
	}
	eo.Region = o.getenv("OS_REGION_NAME")
	switch o.iface() {
	case "public":
		eo.Availability = gophercloud.AvailabilityPublic
	case "admin":
		eo.Availability = gophercloud.AvailabilityAdmin
	default:
		eo.Availability = gophercloud.AvailabilityInternal
	}
	return ao, eo, nil
}

func (o RegisterOptions) iface() string {
	if v := o.getenv("OS_INTERFACE"); v != "" {
		return strings.TrimSuffix(v, "URL")
	}
	return "internal"
}

func dialOpenStack(ctx context.Context, o RegisterOptions) (*osAPI, error) {
	ao, eo, err := o.authOptions()
	if err != nil {
		return nil, err
	}
	pc, err := gopenstack.NewClient(ao.IdentityEndpoint)
	if err != nil {
		return nil, fmt.Errorf("register: keystone %s: %w", ao.IdentityEndpoint, err)
	}
	pc.HTTPClient = http.Client{Timeout: 60 * time.Second}
	if err := gopenstack.Authenticate(ctx, pc, ao); err != nil {
		if gophercloud.ResponseCodeIs(err, http.StatusUnauthorized) || gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return nil, fmt.Errorf("register: Keystone at %s refused %s: %w; check the OS_* credentials (OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME, domains)", ao.IdentityEndpoint, ao.Username, err)
		}
		return nil, fmt.Errorf("register: cannot reach Keystone at %s: %w; check the --register URL and that Keystone runs", ao.IdentityEndpoint, err)
	}
	api := &osAPI{}
	if res, ok := pc.GetAuthResult().(tokens.CreateResult); ok {
		if p, err := res.ExtractProject(); err == nil && p != nil {
			api.adminProject = p.ID
		}
	}
	if api.adminProject == "" {
		return nil, errors.New("register: the Keystone token has no project scope; set OS_PROJECT_NAME to the admin project")
	}
	if api.keystone, err = gopenstack.NewIdentityV3(pc, eo); err != nil {
		return nil, fmt.Errorf("register: Keystone's catalog has no identity endpoint: %w", err)
	}
	if api.neutron, err = gopenstack.NewNetworkV2(pc, eo); err != nil {
		return nil, fmt.Errorf("register: Neutron (network, %s interface) not reachable through the catalog: %w", o.iface(), err)
	}
	if api.octavia, err = gopenstack.NewLoadBalancerV2(pc, eo); err != nil {
		api.octavia = nil // only needed when the topology has load balancers
	}
	urls := []string{ao.IdentityEndpoint, api.keystone.Endpoint, api.neutron.Endpoint}
	if api.octavia != nil {
		urls = append(urls, api.octavia.Endpoint)
	}
	if nova, err := gopenstack.NewComputeV2(pc, eo); err == nil {
		urls = append(urls, nova.Endpoint)
	}
	for _, s := range urls {
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			hp := u.Host
			if u.Port() == "" {
				hp = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
			}
			if !slices.Contains(api.endpoints, hp) {
				api.endpoints = append(api.endpoints, hp)
			}
		}
	}
	return api, nil
}

// call sends one JSON request; path is relative to the service's resource
// base (e.g. "ports", "lbaas/loadbalancers/ID").
func call(ctx context.Context, sc *gophercloud.ServiceClient, method, path string, hdr map[string]string, body, out any, ok ...int) error {
	opts := &gophercloud.RequestOpts{JSONBody: body, JSONResponse: out, OkCodes: ok, MoreHeaders: hdr}
	u := sc.ResourceBaseURL() + path
	if _, err := sc.Request(ctx, method, u, opts); err != nil {
		return fmt.Errorf("%s %s: %w", method, u, err)
	}
	return nil
}

// cloudsYAML is the clouds.yaml the lab's tapflow reads its inventory
// with (mode 0600 in the state directory: it holds the password).
func (o RegisterOptions) cloudsYAML() ([]byte, error) {
	auth := map[string]string{"auth_url": o.AuthURL, "username": o.getenv("OS_USERNAME"), "password": o.getenv("OS_PASSWORD"),
		"project_name": o.getenv("OS_PROJECT_NAME")}
	for env, key := range map[string]string{"OS_USER_DOMAIN_ID": "user_domain_id", "OS_USER_DOMAIN_NAME": "user_domain_name",
		"OS_PROJECT_DOMAIN_ID": "project_domain_id", "OS_PROJECT_DOMAIN_NAME": "project_domain_name"} {
		if v := o.getenv(env); v != "" {
			auth[key] = v
		}
	}
	if auth["user_domain_id"] == "" && auth["user_domain_name"] == "" {
		auth["user_domain_id"] = "default"
	}
	if auth["project_domain_id"] == "" && auth["project_domain_name"] == "" {
		auth["project_domain_id"] = "default"
	}
	entry := map[string]any{"auth": auth, "interface": o.iface()}
	if r := o.getenv("OS_REGION_NAME"); r != "" {
		entry["region_name"] = r
	}
	return yaml.Marshal(map[string]any{"clouds": map[string]any{"lab": entry}})
}
