package openstack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/tapflow/tapflow/internal/version"
)

// creds is what New resolves from the config, clouds.yaml and the
// environment: no network involved.
type creds struct {
	source  string // "noauth", `clouds.yaml entry "x"`, "OS_* environment"
	method  string // password, application credential, token, noauth
	ao      gophercloud.AuthOptions
	eo      gophercloud.EndpointOpts
	tls     *tls.Config
	secrets []string // scrubbed from every error
}

func availability(iface string) gophercloud.Availability {
	switch iface {
	case "public":
		return gophercloud.AvailabilityPublic
	case "admin":
		return gophercloud.AvailabilityAdmin
	}
	return gophercloud.AvailabilityInternal
}

// resolveCreds picks the auth source: noauth, a clouds.yaml entry, or the
// OS_* variables. Errors say which source and what to fix.
func resolveCreds(cfg Config, getenv func(string) string) (*creds, error) {
	if cfg.NoAuth != nil {
		tok := cfg.NoAuth.Token
		if tok == "" {
			tok = "admin:admin"
		}
		return &creds{source: "noauth", method: "noauth", ao: gophercloud.AuthOptions{TokenID: tok}}, nil
	}
	c := &creds{}
	cloud := cfg.Cloud
	if cloud == "" {
		cloud = getenv("OS_CLOUD")
	}
	if cloud != "" || cfg.CloudsFile != "" {
		if cloud == "" {
			return nil, errors.New("openstack auth: clouds_file is set but no cloud is named; set inventory.openstack.cloud or OS_CLOUD to the clouds.yaml entry")
		}
		opts := []clouds.ParseOption{clouds.WithCloudName(cloud)}
		if cfg.CloudsFile != "" {
			opts = append(opts, clouds.WithLocations(cfg.CloudsFile))
		}
		ao, eo, tlsc, err := clouds.Parse(opts...)
		if err != nil {
			where := "the standard locations (OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/, /etc/openstack/)"
			if cfg.CloudsFile != "" {
				where = cfg.CloudsFile
			}
			return nil, fmt.Errorf("openstack auth: clouds.yaml entry %q from %s: %w; fix the file or inventory.openstack.cloud/OS_CLOUD", cloud, where, err)
		}
		c.source, c.ao, c.eo, c.tls = fmt.Sprintf("clouds.yaml entry %q", cloud), ao, eo, tlsc
	} else {
		ao, region, tlsc, err := authFromEnv(getenv)
		if err != nil {
			return nil, err
		}
		c.source, c.ao, c.tls = "OS_* environment", ao, tlsc
		c.eo.Region = region
	}
	if c.ao.IdentityEndpoint == "" {
		return nil, fmt.Errorf("openstack auth: %s has no auth_url; set it (e.g. https://keystone.example:5000/v3)", c.source)
	}
	if p := httpURLProblem(c.ao.IdentityEndpoint); p != "" {
		return nil, fmt.Errorf("openstack auth: %s: auth_url %s; use Keystone's URL, e.g. https://keystone.example:5000/v3", c.source, p)
	}
	switch {
	case c.ao.TokenID != "":
		c.method = "token"
	case c.ao.ApplicationCredentialID != "" || c.ao.ApplicationCredentialName != "":
		c.method = "application credential"
		if c.ao.ApplicationCredentialSecret == "" {
			return nil, fmt.Errorf("openstack auth: %s: application credential without its secret; set application_credential_secret (OS_APPLICATION_CREDENTIAL_SECRET)", c.source)
		}
	case c.ao.Password != "":
		c.method = "password"
		if c.ao.Username == "" && c.ao.UserID == "" {
			return nil, fmt.Errorf("openstack auth: %s: password without a user; set username (OS_USERNAME) or user_id", c.source)
		}
	default:
		return nil, fmt.Errorf("openstack auth: %s has no credentials; set a password, an application credential id and secret, or a token", c.source)
	}
	// A token cannot be renewed; everything else re-authenticates when
	// Keystone answers 401.
	c.ao.AllowReauth = c.ao.TokenID == ""
	c.eo.Availability = availability(cfg.Interface)
	if cfg.Region != "" {
		c.eo.Region = cfg.Region
	}
	for _, s := range []string{c.ao.Password, c.ao.Passcode, c.ao.ApplicationCredentialSecret, c.ao.TokenID} {
		if s != "" {
			c.secrets = append(c.secrets, s)
		}
	}
	return c, nil
}

// CheckAuth resolves the credentials New would use (noauth, the
// clouds.yaml entry or the OS_* environment of this process) without
// contacting anything, so tapflow validate reports a missing entry, a
// missing credential or a bad auth_url before start-up. Secrets are not
// in the error.
func CheckAuth(cfg Config) error {
	_, err := resolveCreds(cfg, os.Getenv)
	return err
}

// httpURLProblem says what is wrong with an http(s) URL ("" when
// nothing): the URL is quoted without any user:password@ in it.
func httpURLProblem(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "does not parse as a URL"
	}
	shown := *u
	shown.User = nil
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("%q: scheme %q, want http or https", shown.String(), u.Scheme)
	case u.Hostname() == "":
		return fmt.Sprintf("%q: no host", shown.String())
	case u.User != nil:
		return fmt.Sprintf("%q: has credentials in it; they belong in the password or application_credential_secret fields", shown.String())
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("%q: port %s is not 1..65535", shown.String(), p)
		}
	}
	return ""
}

// authFromEnv reads the OS_* variables python-openstackclient reads:
// OS_AUTH_URL; OS_USERNAME/OS_USER_ID + OS_PASSWORD with
// OS_USER_DOMAIN_NAME/_ID, or OS_APPLICATION_CREDENTIAL_ID/_NAME +
// _SECRET, or OS_TOKEN; the scope from OS_PROJECT_ID or OS_PROJECT_NAME +
// OS_PROJECT_DOMAIN_NAME/_ID (OS_DOMAIN_* as fallback); OS_REGION_NAME;
// OS_CACERT and OS_INSECURE.
func authFromEnv(getenv func(string) string) (gophercloud.AuthOptions, string, *tls.Config, error) {
	first := func(keys ...string) string {
		for _, k := range keys {
			if v := getenv(k); v != "" {
				return v
			}
		}
		return ""
	}
	ao := gophercloud.AuthOptions{
		IdentityEndpoint:            getenv("OS_AUTH_URL"),
		Username:                    getenv("OS_USERNAME"),
		UserID:                      first("OS_USER_ID", "OS_USERID"),
		Password:                    getenv("OS_PASSWORD"),
		DomainID:                    first("OS_USER_DOMAIN_ID", "OS_DOMAIN_ID"),
		DomainName:                  first("OS_USER_DOMAIN_NAME", "OS_DOMAIN_NAME"),
		ApplicationCredentialID:     getenv("OS_APPLICATION_CREDENTIAL_ID"),
		ApplicationCredentialName:   getenv("OS_APPLICATION_CREDENTIAL_NAME"),
		ApplicationCredentialSecret: getenv("OS_APPLICATION_CREDENTIAL_SECRET"),
		TokenID:                     getenv("OS_TOKEN"),
	}
	if ao.IdentityEndpoint == "" {
		return ao, "", nil, errors.New("openstack auth: no credentials: OS_CLOUD, inventory.openstack.cloud and OS_AUTH_URL are all unset; " +
			"name a clouds.yaml entry, export the OS_* variables (an openrc file), or use inventory.openstack.noauth for API servers without Keystone")
	}
	// Application credentials and tokens carry their own scope.
	if ao.ApplicationCredentialID == "" && ao.ApplicationCredentialName == "" {
		switch {
		case first("OS_PROJECT_ID", "OS_TENANT_ID") != "":
			ao.Scope = &gophercloud.AuthScope{ProjectID: first("OS_PROJECT_ID", "OS_TENANT_ID")}
		case first("OS_PROJECT_NAME", "OS_TENANT_NAME") != "":
			ao.Scope = &gophercloud.AuthScope{
				ProjectName: first("OS_PROJECT_NAME", "OS_TENANT_NAME"),
				DomainID:    first("OS_PROJECT_DOMAIN_ID", "OS_DOMAIN_ID"),
				DomainName:  first("OS_PROJECT_DOMAIN_NAME", "OS_DOMAIN_NAME"),
			}
			if ao.Scope.DomainID == "" && ao.Scope.DomainName == "" {
				ao.Scope.DomainID = "default"
			}
		case getenv("OS_SYSTEM_SCOPE") == "all":
			ao.Scope = &gophercloud.AuthScope{System: true}
		}
	}
	switch {
	case ao.TokenID != "":
		// a token names its user already; Keystone refuses a user with it
		ao.Username, ao.UserID, ao.Password, ao.DomainID, ao.DomainName = "", "", "", "", ""
		ao.ApplicationCredentialID, ao.ApplicationCredentialName, ao.ApplicationCredentialSecret = "", "", ""
	case ao.ApplicationCredentialID != "":
		ao.Username, ao.Password, ao.DomainID, ao.DomainName = "", "", "", ""
	case ao.Password != "" && ao.UserID == "" && ao.DomainID == "" && ao.DomainName == "":
		ao.DomainID = "default"
	}
	var tlsc *tls.Config
	if ca, insecure := getenv("OS_CACERT"), getenv("OS_INSECURE"); ca != "" || insecure != "" {
		tlsc = &tls.Config{MinVersion: tls.VersionTLS12}
		if ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return ao, "", nil, fmt.Errorf("openstack auth: OS_CACERT: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return ao, "", nil, fmt.Errorf("openstack auth: OS_CACERT %s holds no PEM certificate", ca)
			}
			tlsc.RootCAs = pool
		}
		if b, _ := strconv.ParseBool(insecure); b {
			tlsc.InsecureSkipVerify = true //nolint:gosec // the operator asked for it with OS_INSECURE
		}
	}
	return ao, getenv("OS_REGION_NAME"), tlsc, nil
}

// clients are the service clients of one authenticated session. A nil
// compute or loadBalancer client means the service is not in the catalog
// (or not configured in noauth mode): its collections are empty.
type clients struct {
	pc           *gophercloud.ProviderClient
	identity     *gophercloud.ServiceClient // nil in noauth mode
	network      *gophercloud.ServiceClient
	compute      *gophercloud.ServiceClient
	loadBalancer *gophercloud.ServiceClient
	absent       []string // services missing from the catalog
}

func (p *Provider) httpClient() http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 8
	if p.creds.tls != nil {
		tr.TLSClientConfig = p.creds.tls
	}
	return http.Client{Timeout: p.cfg.Timeout.D(), Transport: tr}
}

// connect authenticates (unless noauth) and builds the service clients.
func (p *Provider) connect(ctx context.Context) (*clients, error) {
	ua := gophercloud.UserAgent{}
	ua.Prepend("tapflow/" + version.Version)
	if p.cfg.NoAuth != nil {
		n := p.cfg.NoAuth
		pc := &gophercloud.ProviderClient{TokenID: p.creds.ao.TokenID, HTTPClient: p.httpClient(), UserAgent: ua}
		c := &clients{pc: pc}
		c.network = noauthClient(pc, n.Neutron, "network", "v2.0")
		if n.Nova != "" {
			c.compute = noauthClient(pc, n.Nova, "compute", "")
		} else {
			c.absent = append(c.absent, "compute (noauth.nova empty)")
		}
		if n.Octavia != "" {
			c.loadBalancer = noauthClient(pc, n.Octavia, "load-balancer", "v2.0")
		} else {
			c.absent = append(c.absent, "load-balancer (noauth.octavia empty)")
		}
		return c, nil
	}
	pc, err := gopenstack.NewClient(p.creds.ao.IdentityEndpoint)
	if err != nil {
		return nil, &FetchError{Endpoint: "keystone", Code: "config", URL: p.creds.ao.IdentityEndpoint, Err: err,
			Fix: "auth_url must be Keystone's URL, e.g. https://keystone.example:5000/v3"}
	}
	pc.HTTPClient = p.httpClient()
	pc.UserAgent = ua
	if err := gopenstack.Authenticate(ctx, pc, p.creds.ao); err != nil {
		return nil, p.classify("keystone", "Keystone", p.creds.ao.IdentityEndpoint, err)
	}
	c := &clients{pc: pc}
	if c.identity, err = gopenstack.NewIdentityV3(pc, p.creds.eo); err != nil {
		return nil, p.catalogError("keystone", "identity", "Keystone", err)
	}
	// gophercloud probes each endpoint's version document: an unreachable
	// endpoint fails here already.
	if c.network, err = gopenstack.NewNetworkV2(pc, p.creds.eo); err != nil {
		return nil, p.catalogError("networks", "network", "Neutron", err)
	}
	if c.compute, err = gopenstack.NewComputeV2(pc, p.creds.eo); err != nil {
		if !isNotFound(err) {
			return nil, p.catalogError("servers", "compute", "Nova", err)
		}
		c.compute, c.absent = nil, append(c.absent, "compute")
	}
	if c.loadBalancer, err = gopenstack.NewLoadBalancerV2(pc, p.creds.eo); err != nil {
		if !isNotFound(err) {
			return nil, p.catalogError("loadbalancers", "load-balancer", "Octavia", err)
		}
		c.loadBalancer, c.absent = nil, append(c.absent, "load-balancer")
	}
	return c, nil
}

func isNotFound(err error) bool {
	var nf *gophercloud.ErrEndpointNotFound
	var nf2 gophercloud.ErrEndpointNotFound
	return errors.As(err, &nf) || errors.As(err, &nf2)
}

func (p *Provider) catalogError(endpoint, typ, service string, err error) error {
	if !isNotFound(err) {
		return p.classify(endpoint, service, "", err)
	}
	region := p.creds.eo.Region
	if region == "" {
		region = "any region"
	}
	return &FetchError{Endpoint: endpoint, Code: "catalog", Err: err,
		Fix: fmt.Sprintf("the Keystone catalog has no %s endpoint on interface %s in %s; set inventory.openstack.interface/region to where it is published",
			typ, p.cfg.Interface, region)}
}

// noauthClient builds a service client for an API server without
// Keystone; version is appended to the resource base unless base already
// ends with it.
func noauthClient(pc *gophercloud.ProviderClient, base, typ, version string) *gophercloud.ServiceClient {
	ep := gophercloud.NormalizeURL(base)
	rb := ep
	if version != "" {
		trimmed := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(ep, "/"), "/"+version), "/v2")
		ep = gophercloud.NormalizeURL(trimmed)
		rb = ep + version + "/"
	}
	return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: ep, ResourceBase: rb, Type: typ}
}
