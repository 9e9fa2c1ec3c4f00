package openstack

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/tapflow/tapflow/internal/units"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(*Config)
		paths []string
	}{
		{"defaults", func(*Config) {}, nil},
		{"interface", func(c *Config) { c.Interface = "internalURL" }, []string{"interface"}},
		{"timeout", func(c *Config) { c.Timeout = units.Duration(time.Millisecond) }, []string{"timeout"}},
		{"page size", func(c *Config) { c.PageSize = 0 }, []string{"page_size"}},
		{"members", func(c *Config) { c.MembersConcurrency = 100 }, []string{"members_concurrency"}},
		{"refresh", func(c *Config) { c.Refresh = 0 }, []string{"refresh"}},
		{"noauth ok", func(c *Config) { c.NoAuth = &NoAuthConfig{Neutron: "http://127.0.0.1:9696"} }, nil},
		{"noauth without neutron, bad nova", func(c *Config) { c.NoAuth = &NoAuthConfig{Nova: "127.0.0.1:8774"} },
			[]string{"noauth.neutron", "noauth.nova"}},
		{"noauth and cloud", func(c *Config) { c.Cloud, c.NoAuth = "x", &NoAuthConfig{Neutron: "http://n"} }, []string{"noauth"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			c.edit(&cfg)
			var got []string
			if err := cfg.Validate(); err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					var fe *units.FieldError
					if !errors.As(e, &fe) {
						t.Fatalf("%v is not a FieldError", e)
					}
					got = append(got, fe.Path)
				}
			}
			if !slices.Equal(got, c.paths) {
				t.Errorf("paths %v, want %v", got, c.paths)
			}
		})
	}
}

func TestResolveCreds(t *testing.T) {
	dir := t.TempDir()
	clouds := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(clouds, []byte(`clouds:
  prod:
    auth:
      auth_url: https://keystone.example:5000/v3
      username: tapflow
      password: pa55word-x
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionTwo
    interface: public
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		cfg     func(*Config)
		env     map[string]string
		method  string
		wantErr string
		check   func(*testing.T, *creds)
	}{
		{name: "noauth", cfg: func(c *Config) { c.NoAuth = &NoAuthConfig{Neutron: "http://n"} }, method: "noauth",
			check: func(t *testing.T, c *creds) {
				if c.ao.TokenID != "admin:admin" {
					t.Errorf("token %q", c.ao.TokenID)
				}
			}},
		{name: "nothing", wantErr: "OS_CLOUD, inventory.openstack.cloud and OS_AUTH_URL are all unset"},
		{name: "env password", env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_USERNAME": "u", "OS_PASSWORD": "secret-1",
			"OS_PROJECT_NAME": "p", "OS_REGION_NAME": "R1"}, method: "password",
			check: func(t *testing.T, c *creds) {
				if c.ao.DomainID != "default" || c.ao.Scope.ProjectName != "p" || c.ao.Scope.DomainID != "default" || c.eo.Region != "R1" ||
					c.eo.Availability != gophercloud.AvailabilityInternal || !c.ao.AllowReauth || !slices.Contains(c.secrets, "secret-1") {
					t.Errorf("%+v %+v %v", c.ao, c.eo, c.ao.Scope)
				}
			}},
		{name: "env password without user", env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_PASSWORD": "x"}, wantErr: "password without a user"},
		{name: "env app credential", env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_APPLICATION_CREDENTIAL_ID": "ac",
			"OS_APPLICATION_CREDENTIAL_SECRET": "s3cr3t", "OS_USER_DOMAIN_NAME": "Default", "OS_PROJECT_NAME": "p"}, method: "application credential",
			check: func(t *testing.T, c *creds) {
				if c.ao.Scope != nil || c.ao.DomainName != "" {
					t.Errorf("app credential carries its scope: %+v", c.ao)
				}
			}},
		{name: "env app credential without secret", env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_APPLICATION_CREDENTIAL_ID": "ac"},
			wantErr: "without its secret; set application_credential_secret (OS_APPLICATION_CREDENTIAL_SECRET)"},
		{name: "env token", env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_TOKEN": "tok-123", "OS_USER_DOMAIN_ID": "default"}, method: "token",
			check: func(t *testing.T, c *creds) {
				if c.ao.AllowReauth || c.ao.DomainID != "" {
					t.Errorf("token: %+v", c.ao)
				}
			}},
		{name: "clouds.yaml", cfg: func(c *Config) { c.Cloud, c.CloudsFile = "prod", clouds }, method: "password",
			check: func(t *testing.T, c *creds) {
				// tapflow's interface (internal) wins over clouds.yaml's public
				if c.eo.Availability != gophercloud.AvailabilityInternal || c.eo.Region != "RegionTwo" || c.ao.Password != "pa55word-x" {
					t.Errorf("%+v", c.eo)
				}
			}},
		{name: "clouds.yaml via OS_CLOUD, region override", cfg: func(c *Config) { c.CloudsFile, c.Region = clouds, "R9" },
			env: map[string]string{"OS_CLOUD": "prod"}, method: "password",
			check: func(t *testing.T, c *creds) {
				if c.eo.Region != "R9" {
					t.Errorf("region %q", c.eo.Region)
				}
			}},
		{name: "clouds.yaml unknown entry", cfg: func(c *Config) { c.Cloud, c.CloudsFile = "dev", clouds }, wantErr: `clouds.yaml entry "dev"`},
		{name: "clouds file without cloud", cfg: func(c *Config) { c.CloudsFile = clouds }, wantErr: "no cloud is named"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			cr, err := resolveCreds(cfg, func(k string) string { return c.env[k] })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cr.method != c.method {
				t.Errorf("method %q, want %q", cr.method, c.method)
			}
			if c.check != nil {
				c.check(t, cr)
			}
		})
	}
}

func TestFollowLink(t *testing.T) {
	base, _ := url.Parse("https://api.example:9876/v2.0/lbaas/loadbalancers?fields=id&fields=provider&limit=2")
	for _, c := range []struct{ next, want string }{
		// Octavia drops fields= and may use the host it sees behind a proxy
		{"http://10.0.0.5:9876/v2/lbaas/loadbalancers?limit=2&marker=m1",
			"https://api.example:9876/v2/lbaas/loadbalancers?fields=id&fields=provider&limit=2&marker=m1"},
		{"http://x/v2.0/ports?fields=id&limit=2&marker=m", "https://api.example:9876/v2.0/ports?fields=id&limit=2&marker=m"},
		{"/v2.0/ports?marker=m", "https://api.example:9876/v2.0/ports?fields=id&fields=provider&marker=m"},
	} {
		got, err := followLink(base, c.next, []string{"id", "provider"})
		if err != nil || got != c.want {
			t.Errorf("followLink(%s) = %s, %v; want %s", c.next, got, err, c.want)
		}
	}
}

func TestCheckObjectAndNextLink(t *testing.T) {
	for _, c := range []struct {
		obj, want string
	}{
		{`{"id":"a","network_id":"n","project_id":"p","mac_address":"m","fixed_ips":[],"device_owner":"","device_id":""}`, ""},
		{`{"id":"a","network_id":"n","tenant_id":"p","mac_address":"m","fixed_ips":[],"device_owner":"","device_id":""}`, ""},
		{`{"id":"a","network_id":"n","mac_address":null,"fixed_ips":[],"device_owner":"","device_id":""}`, "missing field project_id or tenant_id, mac_address"},
		{`[1]`, "not an object"},
	} {
		err := checkObject([]byte(c.obj), colPorts)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("checkObject(%s) = %v, want %q", c.obj, err, c.want)
		}
	}
	if err := checkObject([]byte(`{"id":"s","network_id":"n","cidr":"c","gateway_ip":null,"ip_version":4}`), colSubnets); err != nil {
		t.Errorf("nullable gateway_ip: %v", err)
	}
	for _, c := range []struct{ top, want string }{
		{`{"ports":[],"ports_links":[{"rel":"previous","href":"p"},{"rel":"next","href":"n"}]}`, "n"},
		{`{"ports":[],"ports_links":[]}`, ""},
		{`{"projects":[],"links":{"next":null,"self":"s"}}`, ""},
		{`{"projects":[],"links":{"next":"k2"}}`, "k2"},
	} {
		m := map[string]jsonRaw{}
		if err := jsonUnmarshal([]byte(c.top), &m); err != nil {
			t.Fatal(err)
		}
		key := "ports"
		if strings.Contains(c.top, "projects") {
			key = "projects"
		}
		got, err := nextLink(m, key)
		if err != nil || got != c.want {
			t.Errorf("nextLink(%s) = %q, %v; want %q", c.top, got, err, c.want)
		}
	}
}

func TestRedactAndClassify(t *testing.T) {
	p := &Provider{cfg: DefaultConfig(), creds: &creds{secrets: []string{"hunter2-pw"}}}
	err := p.scrub(&FetchError{Endpoint: "keystone", Code: "401", Err: errors.New(`HTTP 401: {"password": "hunter2-pw"}`)})
	if strings.Contains(err.Error(), "hunter2-pw") || !strings.Contains(err.Error(), "[REDACTED]") {
		t.Errorf("scrub: %v", err)
	}
	var fe *FetchError
	if !errors.As(err, &fe) || fe.Code != "401" {
		t.Errorf("scrub lost the FetchError: %#v", err)
	}
	for _, c := range []struct {
		err        error
		code, text string
	}{
		{gophercloud.ErrUnexpectedResponseCode{Actual: 403, Body: []byte("forbidden")}, "403", "admin"},
		{gophercloud.ErrUnexpectedResponseCode{Actual: 503, Body: []byte("down")}, "503", "Neutron failed"},
		{&url.Error{Op: "Get", URL: "http://x", Err: errors.New("connection refused")}, "network", "cannot reach Neutron"},
		{errors.New("odd"), "other", "unexpected"},
	} {
		fe := p.classify("ports", "Neutron", "http://x/v2.0/ports", c.err)
		if fe.Code != c.code || !strings.Contains(fe.Error(), c.text) || !strings.Contains(fe.Error(), "openstack ports: GET http://x/v2.0/ports") {
			t.Errorf("classify(%v) = %s / %v", c.err, fe.Code, fe)
		}
	}
}

func TestAmphoraProvider(t *testing.T) {
	for p, want := range map[string]bool{"": true, "amphora": true, "Octavia": true, "ovn": false, "noop_driver": false} {
		if amphoraProvider(p) != want {
			t.Errorf("amphoraProvider(%q) != %v", p, want)
		}
	}
}

type jsonRaw = json.RawMessage

var jsonUnmarshal = json.Unmarshal
