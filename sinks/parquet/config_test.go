package parquet

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/internal/units"
)

func TestDefaultConfigValid(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Output = "/var/lib/tapflow"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults with an output: %v", err)
	}
	if cfg.RollSize != 128<<20 || cfg.RollAge.D() != 5*time.Minute || cfg.Compression != CompressionZstd {
		t.Fatalf("defaults %+v; want 128MiB, 5m, zstd", cfg)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		paths []string // every FieldError path reported
	}{
		{"ok", func(*Config) {}, nil},
		{"no output", func(c *Config) { c.Output = "" }, []string{"output"}},
		{"s3 output without staging dir", func(c *Config) { c.Output = "s3://bucket/flows" }, []string{"staging_dir"}},
		{"other scheme", func(c *Config) { c.Output = "gs://bucket/flows" }, []string{"output"}},
		{"tiny roll size", func(c *Config) { c.RollSize = 1000 }, []string{"roll_size"}},
		{"short roll age", func(c *Config) { c.RollAge = units.Duration(10 * time.Millisecond) }, []string{"roll_age"}},
		{"writer with a slash", func(c *Config) { c.Writer = "a/b" }, []string{"writer"}},
		{"writer with @", func(c *Config) { c.Writer = "a@b" }, []string{"writer"}},
		{"lz4", func(c *Config) { c.Compression = "lz4" }, []string{"compression"}},
		{"row groups", func(c *Config) { c.RowGroupRows = 10 }, []string{"row_group_rows"}},
		{"open files", func(c *Config) { c.MaxOpenFiles = 0 }, []string{"max_open_files"}},
		// The memory bound: row groups are buffered per open file.
		{"row groups holding whole 1GiB files", func(c *Config) { c.RowGroupRows, c.RollSize = 64<<20, 1<<30 }, []string{"max_open_files"}},
		{"1024 open files", func(c *Config) { c.MaxOpenFiles = 1024 }, []string{"max_open_files"}},
		{"64 open files of 1M-row groups", func(c *Config) { c.MaxOpenFiles, c.RowGroupRows = 64, 1<<20 }, []string{"max_open_files"}},
		{"16 open files at the defaults", func(c *Config) { c.MaxOpenFiles = 16 }, nil},
		{"1M-row groups, 8 files", func(c *Config) { c.RowGroupRows = 1 << 20 }, nil},
		{"huge row groups, small files", func(c *Config) { c.RowGroupRows, c.RollSize = 64<<20, 64<<20 }, nil},
		{"everything at once", func(c *Config) {
			*c = Config{}
		}, []string{"output", "roll_size", "roll_age", "compression", "row_group_rows", "max_open_files"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Output = "/data"
			tc.edit(&cfg)
			err := cfg.Validate()
			var got []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					var fe *units.FieldError
					if !errors.As(e, &fe) || fe.Fix == "" {
						t.Errorf("%v is not a *units.FieldError with a fix", e)
						continue
					}
					got = append(got, fe.Path)
				}
			}
			if !slices.Equal(got, tc.paths) {
				t.Fatalf("paths %v, want %v (err: %v)", got, tc.paths, err)
			}
			if _, nerr := New(cfg, Options{Node: "n"}); (nerr != nil) != (len(tc.paths) > 0) {
				t.Fatalf("New: %v, want an error: %v", nerr, len(tc.paths) > 0)
			}
		})
	}
}

func TestConfigYAML(t *testing.T) {
	cfg := DefaultConfig()
	in := "output: /data\nroll_size: 64MiB\nroll_age: 30s\nwriter: collector-1\ncompression: snappy\n"
	if err := yaml.Unmarshal([]byte(in), &cfg); err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Output, want.RollSize, want.RollAge, want.Writer, want.Compression = "/data", 64<<20, units.Duration(30*time.Second), "collector-1", "snappy"
	if cfg != want {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	err := yaml.Unmarshal([]byte("roll_size: 12x\n"), &cfg)
	if err == nil || !strings.Contains(err.Error(), "not a size; use e.g. 128MiB") {
		t.Fatalf("bad size: %v", err)
	}
}

func TestWriterName(t *testing.T) {
	for _, tc := range []struct {
		writer, node, want string
		fails              bool
	}{
		{"", "compute-01.example.org", "compute-01.example.org", false},
		{"collector-a", "compute-01", "collector-a", false},
		{"", "", "", true},
		{"", "bad@node", "", true},
	} {
		cfg := DefaultConfig()
		cfg.Output, cfg.Writer = t.TempDir(), tc.writer
		s, err := New(cfg, Options{Node: tc.node})
		if (err != nil) != tc.fails {
			t.Errorf("writer %q node %q: %v, want failure %v", tc.writer, tc.node, err, tc.fails)
			continue
		}
		if err == nil && s.Writer() != tc.want {
			t.Errorf("writer %q node %q: %q, want %q", tc.writer, tc.node, s.Writer(), tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "collector.writer") {
			t.Errorf("error %q does not say which field to set", err)
		}
	}
}

func TestMetricsRegistry(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Output = t.TempDir()
	e := newSink(t, cfg)
	if _, err := New(cfg, Options{Node: "x", Registry: e.reg}); err == nil {
		t.Fatal("a second sink registered the same metrics")
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, n := range []string{"tapflow_parquet_files_committed_total", "tapflow_parquet_bytes_committed_total", "tapflow_parquet_rows_committed_total",
		"tapflow_parquet_commit_errors_total", "tapflow_parquet_open_files", "tapflow_parquet_commit_seconds"} {
		if !slices.Contains(names, n) {
			t.Errorf("metric %s not registered (have %v)", n, names)
		}
	}
	if err := e.sink.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := New(cfg, Options{Node: "x", Registry: e.reg})
	if err != nil {
		t.Fatalf("after Close, a new sink cannot register: %v", err)
	}
	_ = s2.Close()
}

// TestRemoteOutputNeedsAClient: an s3:// output with a staging dir is a
// valid config, but the sink refuses to start without the store client.
func TestRemoteOutputNeedsAClient(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Output, cfg.StagingDir = "s3://bucket/flows", t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg, Options{Node: "n"}); err == nil || !strings.Contains(err.Error(), "Options.Remote") {
		t.Fatalf("New without Remote: %v", err)
	}
}
