package flowlogs

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
)

// Placeholder is what Config.Location replaces with a project's ID.
const Placeholder = "{project_id}"

// Config is the billing.flow_logs section.
type Config struct {
	// Location is where a project's flow logs go: an s3:// URL template
	// holding {project_id} in the bucket or the prefix, e.g.
	// s3://flowlogs-{project_id}/tapflow or s3://tenant-logs/{project_id}.
	// Empty: tenant flow logs are off.
	Location string `yaml:"location"`
	// Projects limits delivery to these project IDs (the projects that
	// asked for flow logs and have a location); empty: every project with
	// records in the hour.
	Projects []string `yaml:"projects"`
	// StagingDir holds the Parquet files being written before they are
	// uploaded (default <data_dir>/flowlogs-staging).
	StagingDir string `yaml:"staging_dir"`
	// Compression is the Parquet codec (as collector.compression; default
	// zstd).
	Compression string `yaml:"compression"`
	// RowGroupRows bounds a row group of a delivered file (default 65536).
	RowGroupRows int `yaml:"row_group_rows"`
	// S3 is how the delivering process reaches the projects' locations:
	// endpoint, region, path_style and its own credentials (profile,
	// credentials_file, else the AWS chain), as collector.s3.
	S3 s3out.Config `yaml:"s3"`
}

// DefaultConfig returns the defaults (StagingDir is derived from data_dir
// by the config loader).
func DefaultConfig() Config {
	return Config{Compression: parquet.CompressionZstd, RowGroupRows: 64 << 10, S3: s3out.DefaultConfig()}
}

// Enabled reports whether flow logs are configured.
func (c Config) Enabled() bool { return c.Location != "" }

// projectID is what a project ID may hold to go into a bucket name or key:
// Keystone IDs are 32 lowercase hex digits; domains may use other
// lowercase names, never '/' or upper case (bucket names refuse them).
var projectID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// bucketName is an S3 bucket name (3–63 lowercase letters, digits, '.',
// '-'; starts and ends with a letter or digit).
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// Validate reports every bad field (keys relative to billing.flow_logs).
func (c Config) Validate() error {
	var e units.Errors
	if c.Location != "" {
		if _, err := c.target("0123456789abcdef0123456789abcdef"); err != nil {
			e.Add("location", err.Error(), "use e.g. s3://flowlogs-{project_id}/tapflow or s3://tenant-logs/{project_id}")
		}
	}
	for _, p := range c.Projects {
		if !projectID.MatchString(p) {
			e.Add("projects", fmt.Sprintf("%q is not a project ID (lowercase letters, digits, '-')", p), "list Keystone project IDs, e.g. 3f2a…(32 hex digits)")
		}
	}
	if _, err := parquet.Codec(c.Compression); err != nil {
		e.Add("compression", fmt.Sprintf("%q is unknown", c.Compression), "use one of "+strings.Join(parquet.Compressions, ", "))
	}
	if c.RowGroupRows < 1024 || c.RowGroupRows > 1<<20 {
		e.Add("row_group_rows", fmt.Sprintf("%d is outside [1024, 1048576]", c.RowGroupRows), "use e.g. 65536")
	}
	e.Merge("s3", c.S3.Validate())
	return e.Err()
}

// target is the location of one project.
func (c Config) target(project string) (s3out.Target, error) {
	loc := c.Location
	if !strings.HasPrefix(loc, "s3://") {
		return s3out.Target{}, fmt.Errorf("%q is not an s3:// URL", loc)
	}
	if !strings.Contains(loc, Placeholder) {
		return s3out.Target{}, fmt.Errorf("%q has no %s: every project would get the same location", loc, Placeholder)
	}
	rest := strings.ReplaceAll(loc, Placeholder, "")
	if i := strings.IndexAny(rest, "{}"); i >= 0 {
		return s3out.Target{}, fmt.Errorf("%q: only %s may be used as a placeholder", loc, Placeholder)
	}
	if !projectID.MatchString(project) {
		return s3out.Target{}, fmt.Errorf("project ID %q cannot go into an S3 location (lowercase letters, digits and '-' only)", project)
	}
	t, err := s3out.ParseTarget(strings.ReplaceAll(loc, Placeholder, project))
	if err != nil {
		return s3out.Target{}, err
	}
	if !bucketName.MatchString(t.Bucket) || strings.Contains(t.Bucket, "..") {
		return s3out.Target{}, fmt.Errorf("bucket %q (for project %s) is not a valid S3 bucket name (3-63 lowercase letters, digits, '.', '-')", t.Bucket, project)
	}
	return t, nil
}

// wants reports whether project's records are delivered.
func (c Config) wants(project string) bool {
	return len(c.Projects) == 0 || slices.Contains(c.Projects, project)
}
