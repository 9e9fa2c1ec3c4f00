package s3out

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tapflow/tapflow/internal/units"
)

// Config is the `collector.s3:` section; it applies when collector.output
// is s3://bucket/prefix.
type Config struct {
	// Endpoint is the S3 API URL for S3-compatible servers (e.g.
	// https://s3.example.net:9000); empty means AWS S3 for Region.
	Endpoint string `yaml:"endpoint"`
	// Region signs requests (default: from the AWS config chain, else
	// us-east-1).
	Region string `yaml:"region"`
	// PathStyle addresses buckets as <endpoint>/<bucket> instead of
	// <bucket>.<endpoint>; most S3-compatible servers need it.
	PathStyle bool `yaml:"path_style"`
	// Profile selects a profile of the shared AWS config/credentials files
	// (default: $AWS_PROFILE, else "default").
	Profile string `yaml:"profile"`
	// CredentialsFile is a shared-credentials file (INI, like
	// ~/.aws/credentials) read instead of the default one.
	CredentialsFile string `yaml:"credentials_file"`
	// PartSize is the multipart part size; files up to it are one PUT
	// (default 64MiB, at least 5MiB).
	PartSize units.ByteSize `yaml:"part_size"`
	// RequestTimeout bounds one PUT or one part (default 5m).
	RequestTimeout units.Duration `yaml:"request_timeout"`
	// MaxBackoff caps the wait between retries of a failed upload; the
	// collector retries until the object is stored, holding its acks
	// (default 30s).
	MaxBackoff units.Duration `yaml:"max_backoff"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{PartSize: 64 << 20, RequestTimeout: units.Duration(5 * time.Minute), MaxBackoff: units.Duration(30 * time.Second)}
}

// Validate reports every bad field.
func (c Config) Validate() error {
	var e units.Errors
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			e.Add("endpoint", fmt.Sprintf("%q is not an http(s) URL", c.Endpoint), "use e.g. https://s3.example.net or http://127.0.0.1:7070, or leave it empty for AWS")
		}
		if u != nil && u.User != nil {
			e.Add("endpoint", "has credentials in it", "remove them: credentials come from the AWS environment, profile or credentials_file")
		}
		if u != nil && u.Port() != "" {
			if n, err := strconv.Atoi(u.Port()); err != nil || n < 1 || n > 65535 {
				e.Add("endpoint", fmt.Sprintf("port %s is not 1..65535", u.Port()), "use e.g. http://127.0.0.1:7070")
			}
		}
	}
	if c.PartSize < 5<<20 || c.PartSize > 5<<30 {
		e.Add("part_size", fmt.Sprintf("%s is outside [5MiB, 5GiB]", c.PartSize), "use e.g. 64MiB")
	}
	if c.RequestTimeout.D() < time.Second {
		e.Add("request_timeout", fmt.Sprintf("%s is below 1s", c.RequestTimeout), "use e.g. 5m")
	}
	if c.MaxBackoff.D() < 100*time.Millisecond {
		e.Add("max_backoff", fmt.Sprintf("%s is below 100ms", c.MaxBackoff), "use e.g. 30s")
	}
	if c.CredentialsFile != "" {
		if _, err := os.Stat(c.CredentialsFile); err != nil {
			e.Add("credentials_file", err.Error(), "point it at a readable AWS credentials file, or leave it empty for the default chain")
		}
	}
	return e.Err()
}

// Target is a parsed s3://bucket/prefix.
type Target struct {
	Bucket string
	Prefix string // no leading or trailing slash; may be empty
}

// IsURL reports whether output names an object store.
func IsURL(output string) bool { return strings.HasPrefix(output, "s3://") }

// ParseTarget parses s3://bucket[/prefix].
func ParseTarget(output string) (Target, error) {
	rest, ok := strings.CutPrefix(output, "s3://")
	if !ok {
		return Target{}, fmt.Errorf("%q: not an s3:// URL", output)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	prefix = strings.Trim(prefix, "/")
	if bucket == "" || strings.ContainsAny(bucket, " ?#") {
		return Target{}, fmt.Errorf("%q: no valid bucket; use s3://bucket/prefix", output)
	}
	if strings.Contains(prefix, "//") || strings.ContainsAny(prefix, "?#") {
		return Target{}, fmt.Errorf("%q: prefix has an empty path element or ?/#", output)
	}
	return Target{Bucket: bucket, Prefix: prefix}, nil
}

// String renders the target as s3://bucket/prefix.
func (t Target) String() string {
	if t.Prefix == "" {
		return "s3://" + t.Bucket
	}
	return "s3://" + t.Bucket + "/" + t.Prefix
}

// Key is the object key of a path relative to the output root.
func (t Target) Key(rel string) string {
	if t.Prefix == "" {
		return rel
	}
	return t.Prefix + "/" + rel
}
