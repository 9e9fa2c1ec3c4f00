package parquet

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/parquet-go/parquet-go/compress"
	"github.com/parquet-go/parquet-go/compress/snappy"
	"github.com/parquet-go/parquet-go/compress/uncompressed"
	"github.com/parquet-go/parquet-go/compress/zstd"

	"github.com/tapflow/tapflow/internal/fsx"
	"github.com/tapflow/tapflow/internal/units"
)

// Compression names accepted in Config.Compression.
const (
	// CompressionZstd is zstd at its fastest level (klauspost SpeedFastest,
	// ≈ zstd -1): the default, by measurement on the collector's path
	// (BenchmarkCollectorWriter, docs/architecture.md): only "none" uses
	// clearly less CPU (median 1.21× the records per CPU-second, for 1.9×
	// the bytes).
	CompressionZstd = "zstd"
	// CompressionZstdDefault is zstd at its default level (≈ zstd -3):
	// 23% smaller files on the collector's benchmark set (2% on the sink's)
	// for 0.69× the collector's records per CPU-second.
	CompressionZstdDefault = "zstd-default"
	// CompressionSnappy writes 17–22% larger files than zstd (49.5
	// B/record on the sink's benchmark set, above the 40 B goal) and,
	// measured on the collector's path, is not clearly faster (0.95–1.06×):
	// the larger pages cost in write(2) and copies what the codec saves.
	CompressionSnappy = "snappy"
	// CompressionNone writes uncompressed pages (3× larger; tests, debugging).
	CompressionNone = "none"
)

// Compressions lists every value Config.Compression accepts.
// LZ4_RAW is not among them: parquet-go v0.32's reader (tapflow report,
// tapflow audit) returns garbage for LZ4_RAW pages compressed less than
// 3× (compress/lz4 Decode allocates a new buffer that Column.decompress
// drops), although DuckDB reads them; and measured on the collector's
// path it was no faster than zstd (BenchmarkCollectorWriter).
var Compressions = []string{CompressionZstd, CompressionZstdDefault, CompressionSnappy, CompressionNone}

// Config is the Parquet sink section of the collector config
// (`collector:` in tapflow.yaml).
type Config struct {
	// Output is the root directory; files go to
	// <output>/flows/dt=YYYY-MM-DD/hour=HH/ (UTC, by time_end). Required.
	// s3://bucket/prefix writes to StagingDir and uploads each committed
	// file to the same layout under the prefix (Options.Remote).
	Output string `yaml:"output"`
	// StagingDir holds files being written and committed files not yet
	// uploaded when Output is s3:// (bounded by one roll: MaxOpenFiles ×
	// RollSize). Required then; ignored for a local output.
	StagingDir string `yaml:"staging_dir"`
	// RollSize commits every open file as soon as one reaches this
	// estimated size (bytes flushed + buffered rows × measured bytes/row).
	// Default 128MiB; at least 64KiB.
	RollSize units.ByteSize `yaml:"roll_size"`
	// RollAge commits every open file once the oldest has been open this
	// long. Default 5m; at least 1s. The transport must not redeliver
	// unacked messages sooner (JetStream AckWait > roll_age + commit time).
	RollAge units.Duration `yaml:"roll_age"`
	// Writer names this collector in file names
	// (<writer>-<first seq>-<last seq>.parquet). Letters, digits, '.', '_'
	// and '-'; unique per collector sharing an output. Empty: the node name.
	Writer string `yaml:"writer"`
	// Compression is zstd (default: fastest level), zstd-default, snappy or
	// none.
	Compression string `yaml:"compression"`
	// RowGroupRows is the number of rows per row group; a row group is
	// buffered in memory (compressed, ≈40 B/row) until it is full, so this
	// bounds memory per open file: ≈30 MiB of heap at the default 262144
	// (≈10 MiB row groups), ≈60 MiB at 1048576. Validate refuses
	// MaxOpenFiles × RowGroupRows whose MemoryEstimate exceeds MemoryBudget.
	RowGroupRows int `yaml:"row_group_rows"`
	// MaxOpenFiles bounds the partitions (hours) open at once, and so the
	// memory (MaxOpenFiles × the per-file figure above): a batch that would
	// open more commits the open files first. Default 8.
	MaxOpenFiles int `yaml:"max_open_files"`
	// FileGroup owns the files and directories the collector writes
	// (mode 0640 / 0750, whatever the umask), so its members (an
	// analytics group) can read them; it must exist. Empty: the
	// collector's own group.
	FileGroup string `yaml:"file_group"`
}

// DefaultConfig returns the defaults; Output must still be set.
func DefaultConfig() Config {
	return Config{
		RollSize:     128 << 20,
		RollAge:      units.Duration(5 * time.Minute),
		Compression:  CompressionZstd,
		RowGroupRows: 256 << 10,
		MaxOpenFiles: 8,
	}
}

var writerName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Validate reports every invalid field as a *units.FieldError, joined
// with errors.Join. An empty Writer is valid (it defaults to the node).
func (c Config) Validate() error {
	var e units.Errors
	switch {
	case c.Output == "":
		e.Add("output", "empty", "set the directory Parquet files are written to, e.g. /var/lib/tapflow")
	case IsRemote(c.Output):
		if c.StagingDir == "" {
			e.Add("staging_dir", "empty with an s3:// output", "set a local directory for files before upload, e.g. /var/lib/tapflow/staging")
		}
	case strings.Contains(c.Output, "://"):
		e.Add("output", fmt.Sprintf("%q: unsupported URL scheme", c.Output), "use a local directory, e.g. /var/lib/tapflow, or s3://bucket/prefix")
	}
	if _, err := fsx.LookupGroup(c.FileGroup); err != nil {
		e.Add("file_group", err.Error(), "create it (groupadd "+c.FileGroup+"), or leave file_group empty for the collector's own group")
	}
	if c.RollSize < 64<<10 {
		e.Add("roll_size", fmt.Sprintf("%s is below 64KiB", c.RollSize), "use e.g. 128MiB")
	}
	if c.RollAge.D() < time.Second {
		e.Add("roll_age", fmt.Sprintf("%s is below 1s", c.RollAge), "use e.g. 5m")
	}
	if c.Writer != "" && !writerName.MatchString(c.Writer) {
		e.Add("writer", fmt.Sprintf("%q has characters other than letters, digits, '.', '_' and '-'", c.Writer), "use e.g. the host name, or leave it empty for the node name")
	}
	if _, err := codecFor(c.Compression); err != nil {
		e.Add("compression", fmt.Sprintf("%q is unknown", c.Compression), "use one of "+strings.Join(Compressions, ", "))
	}
	if c.RowGroupRows < 1024 || c.RowGroupRows > 64<<20 {
		e.Add("row_group_rows", fmt.Sprintf("%d is outside [1024, 67108864]", c.RowGroupRows), "use e.g. 262144")
	}
	if c.MaxOpenFiles < 1 || c.MaxOpenFiles > 1024 {
		e.Add("max_open_files", fmt.Sprintf("%d is outside [1, 1024]", c.MaxOpenFiles), "use e.g. 8")
	}
	if e.Err() == nil {
		if est := c.MemoryEstimate(); est > MemoryBudget {
			e.Add("max_open_files", fmt.Sprintf("%d open files × (%s + min(row_group_rows %d × %d B, roll_size %s)) ≈ %s of buffered row groups, above the sink's %s memory budget",
				c.MaxOpenFiles, units.ByteSize(fileOverhead), c.RowGroupRows, rowGroupBytesPerRow, c.RollSize, units.ByteSize(est), units.ByteSize(MemoryBudget)),
				"lower collector.row_group_rows (default 262144) or collector.max_open_files (default 8)")
		}
	}
	return e.Err()
}

// MemoryBudget caps MemoryEstimate: settings above it are refused, since
// they would let the collector's memory grow with the data (a row group
// holding whole files, thousands of open files).
const MemoryBudget = 1 << 30

const (
	// fileOverhead is the memory of one open file besides its row group:
	// page buffers (pageBufferSize per column) and dictionaries; kept at
	// the figure measured with 256 KiB page buffers (an upper bound).
	fileOverhead = 16 << 20
	// rowGroupBytesPerRow is what a buffered row costs until its row group
	// is flushed (flow.v1 compresses to ≈40 B/row; pages buffered
	// uncompressed add to it).
	rowGroupBytesPerRow = 64
)

// MemoryEstimate is what the open files may buffer at once:
// MaxOpenFiles × (fileOverhead + the current row group, which a file's
// roll at RollSize caps). At the defaults: 8 × (16 + 16) MiB = 256 MiB;
// BenchmarkCollectorRSS measures the whole collector.
func (c Config) MemoryEstimate() int64 {
	group := min(int64(c.RowGroupRows)*rowGroupBytesPerRow, int64(c.RollSize))
	return int64(c.MaxOpenFiles) * (fileOverhead + group)
}

// IsRemote reports whether output names an object store (s3://…).
func IsRemote(output string) bool { return strings.HasPrefix(output, "s3://") }

// Codec returns the Parquet codec of a Compression name (other writers of
// tapflow Parquet, such as billing/flowlogs, use the collector's settings).
func Codec(name string) (compress.Codec, error) { return codecFor(name) }

func codecFor(name string) (compress.Codec, error) {
	switch name {
	case CompressionZstd:
		return newZstdCodec(zstd.SpeedFastest), nil
	case CompressionZstdDefault:
		return newZstdCodec(zstd.SpeedDefault), nil
	case CompressionSnappy:
		return &snappy.Codec{}, nil
	case CompressionNone:
		return &uncompressed.Codec{}, nil
	}
	return nil, fmt.Errorf("compression %q: unknown", name)
}
