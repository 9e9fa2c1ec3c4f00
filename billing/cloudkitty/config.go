package cloudkitty

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/units"
)

// Config is the billing.cloudkitty section: how tapflow reaches CloudKitty
// to schedule the reprocess of an hour corrected after it was published.
// Credentials are Keystone's, resolved as for inventory.openstack (a
// clouds.yaml entry, else the OS_* variables); the user needs the admin
// role (CloudKitty's policy for POST /v2/task/reprocesses and GET
// /v2/scope).
type Config struct {
	// Enabled turns the reprocess hook on. Off (default): a correction
	// only reaches Prometheus, and CloudKitty bills the corrected total
	// only for hours it has not rated yet.
	Enabled bool `yaml:"enabled"`
	// Cloud is the clouds.yaml entry. Empty: $OS_CLOUD, else the OS_*
	// variables.
	Cloud string `yaml:"cloud"`
	// CloudsFile is the clouds.yaml to read. Empty: the standard search.
	CloudsFile string `yaml:"clouds_file"`
	// Interface is the catalog interface of the rating endpoint: internal
	// (default), public or admin.
	Interface string `yaml:"interface"`
	// Region picks the catalog endpoint. Empty: clouds.yaml's or
	// $OS_REGION_NAME.
	Region string `yaml:"region"`
	// Endpoint overrides the catalog's rating endpoint, e.g.
	// http://cloudkitty.example:8889 (Keystone still issues the token).
	Endpoint string `yaml:"endpoint"`
	// Timeout bounds each HTTP request.
	Timeout units.Duration `yaml:"timeout"`
}

// DefaultConfig is the shipped billing.cloudkitty.
func DefaultConfig() Config {
	return Config{Interface: "internal", Timeout: units.Duration(30 * time.Second)}
}

// Validate checks the section without contacting anything.
func (c Config) Validate() error {
	switch c.Interface {
	case "", "internal", "public", "admin":
	default:
		return fmt.Errorf("billing.cloudkitty.interface %q: want internal, public or admin", c.Interface)
	}
	if c.Timeout < 0 {
		return errors.New("billing.cloudkitty.timeout is negative; set a duration such as 30s")
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return fmt.Errorf("billing.cloudkitty.endpoint %q: want an http(s) URL without credentials, e.g. http://cloudkitty.example:8889", redact(c.Endpoint))
		}
	}
	return nil
}

// auth is the inventory provider's view of these credentials.
func (c Config) auth() openstack.Config {
	iface := c.Interface
	if iface == "" {
		iface = "internal"
	}
	return openstack.Config{Cloud: c.Cloud, CloudsFile: c.CloudsFile, Interface: iface, Region: c.Region, Timeout: c.Timeout}
}

// redact drops any user:password@ from a URL for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	return u.String()
}
