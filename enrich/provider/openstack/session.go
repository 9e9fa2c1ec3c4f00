package openstack

import (
	"context"
	"errors"
	"os"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"

	"github.com/tapflow/tapflow/internal/version"
)

// Session authenticates with cfg's credentials as the inventory provider
// does (a clouds.yaml entry or the OS_* variables; OS_CACERT/OS_INSECURE;
// re-authentication on 401 unless a token was given) and returns the
// provider client and the catalog options (interface, region). Other
// tapflow components that call OpenStack APIs (billing/cloudkitty) use it,
// so every credential source and error message is the same. noauth has no
// Keystone and is refused. Errors are *FetchError with secrets left out.
func Session(ctx context.Context, cfg Config) (*gophercloud.ProviderClient, gophercloud.EndpointOpts, error) {
	if cfg.NoAuth != nil {
		return nil, gophercloud.EndpointOpts{}, errors.New("openstack auth: noauth has no Keystone; configure a clouds.yaml entry or the OS_* variables")
	}
	c, err := resolveCreds(cfg, os.Getenv)
	if err != nil {
		return nil, gophercloud.EndpointOpts{}, err
	}
	p := &Provider{cfg: cfg, creds: c}
	pc, err := gopenstack.NewClient(c.ao.IdentityEndpoint)
	if err != nil {
		return nil, c.eo, &FetchError{Endpoint: "keystone", Code: "config", URL: c.ao.IdentityEndpoint, Err: err,
			Fix: "auth_url must be Keystone's URL, e.g. https://keystone.example:5000/v3"}
	}
	pc.HTTPClient = p.httpClient()
	pc.UserAgent.Prepend("tapflow/" + version.Version)
	if err := gopenstack.Authenticate(ctx, pc, c.ao); err != nil {
		return nil, c.eo, p.classify("keystone", "Keystone", c.ao.IdentityEndpoint, err)
	}
	return pc, c.eo, nil
}
