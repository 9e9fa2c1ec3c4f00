// Package dataset lists and opens the committed Parquet files of a
// collector output — a directory or s3://bucket/prefix, with the layout
// <output>/<schema dir>/dt=YYYY-MM-DD/hour=HH/<file>.parquet that package
// sinks/parquet writes — for the readers of that output (tapflow report and
// tapflow audit). Temp files (dot-prefixed names, .tmp) are never listed.
//
// An S3 object is fetched whole into memory when it is opened (one at a
// time per reader: at most collector.roll_size plus the Parquet footer
// slack), so a reader costs one GET per file instead of one per page.
package dataset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/s3out"
)

// File is one committed Parquet file.
type File struct {
	// Rel is the path below the output root, slash-separated:
	// flows/dt=2026-12-02/hour=10/c1-1-9.parquet.
	Rel  string
	Size int64
}

// Partition is the file's directory below its schema directory
// (dt=YYYY-MM-DD/hour=HH), "" for a file directly in it.
func (f File) Partition() string {
	_, rest, _ := strings.Cut(path.Dir(f.Rel), "/")
	return rest
}

// Output is a collector output to read from.
type Output struct {
	dir    string // local root, when not S3
	target s3out.Target
	client *s3.Client
	name   string
}

// Options configure access to an s3:// output; ignored for a directory.
type Options struct {
	// S3 is the collector.s3 section (endpoint, region, path_style,
	// profile, credentials_file); credentials come from the AWS chain.
	S3 s3out.Config
	// Client replaces the client built from S3 (tests).
	Client *s3.Client
}

// Open validates output (a directory, or s3://bucket/prefix) and, for S3,
// builds the client; it lists nothing yet.
func Open(ctx context.Context, output string, opts Options) (*Output, error) {
	if output == "" {
		return nil, errors.New("no data given: name the collector output, a directory (collector.output) or s3://bucket/prefix")
	}
	if !s3out.IsURL(output) {
		st, err := os.Stat(output)
		if err != nil {
			return nil, fmt.Errorf("%w; point --data at the collector output (the directory holding flows/ and meters/)", err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("%s is not a directory; point --data at the collector output (the directory holding flows/ and meters/)", output)
		}
		return &Output{dir: output, name: output}, nil
	}
	cfg := opts.S3
	if cfg.PartSize == 0 { // readers never upload: only the client settings matter
		d := s3out.DefaultConfig()
		cfg.PartSize, cfg.RequestTimeout, cfg.MaxBackoff = d.PartSize, d.RequestTimeout, d.MaxBackoff
	}
	store, err := s3out.New(output, cfg, s3out.Options{Logger: slog.New(slog.DiscardHandler), Client: opts.Client})
	if err != nil {
		return nil, err
	}
	c := opts.Client
	if c == nil {
		if c, err = store.Client(ctx); err != nil {
			return nil, err
		}
	}
	return &Output{target: store.Target(), client: c, name: store.String()}, nil
}

// String names the output (the directory, or s3://bucket/prefix).
func (o *Output) String() string { return o.name }

// Where is the location of a file for messages: its path or its s3:// URL.
func (o *Output) Where(f File) string {
	if o.client != nil {
		return "s3://" + o.target.Bucket + "/" + o.target.Key(f.Rel)
	}
	return filepath.Join(o.dir, filepath.FromSlash(f.Rel))
}

// ErrNoDir is returned by List when the schema directory does not exist.
var ErrNoDir = errors.New("no such schema directory")

// List returns the committed .parquet files under dir (flows, meters),
// sorted by Rel. A missing dir is ErrNoDir (wrapped).
func (o *Output) List(ctx context.Context, dir string) ([]File, error) {
	var out []File
	if o.client == nil {
		root := filepath.Join(o.dir, dir)
		if st, err := os.Stat(root); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("%s: %w", root, ErrNoDir)
		}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() {
				if p != root && strings.HasPrefix(name, ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if !committed(name) {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(o.dir, p)
			out = append(out, File{Rel: filepath.ToSlash(rel), Size: info.Size()})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", root, err)
		}
	} else {
		prefix := o.target.Key(dir) + "/"
		p := s3.NewListObjectsV2Paginator(o.client, &s3.ListObjectsV2Input{Bucket: aws.String(o.target.Bucket), Prefix: aws.String(prefix)})
		for p.HasMorePages() {
			lctx, cancel := context.WithTimeout(ctx, time.Minute)
			page, err := p.NextPage(lctx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("list s3://%s/%s: %w", o.target.Bucket, prefix, err)
			}
			for _, obj := range page.Contents {
				key := aws.ToString(obj.Key)
				rel := dir + "/" + strings.TrimPrefix(key, prefix)
				if committed(path.Base(rel)) && !hidden(rel) {
					out = append(out, File{Rel: rel, Size: aws.ToInt64(obj.Size)})
				}
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("s3://%s/%s: %w (no objects)", o.target.Bucket, prefix, ErrNoDir)
		}
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Rel, b.Rel) })
	return out, nil
}

func committed(name string) bool {
	return !strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".parquet")
}

// hidden reports whether a directory of rel is dot-prefixed.
func hidden(rel string) bool {
	for _, p := range strings.Split(path.Dir(rel), "/") {
		if strings.HasPrefix(p, ".") {
			return true
		}
	}
	return false
}

// Reader is an open file: ReadAt, Size, Close.
type Reader interface {
	io.ReaderAt
	io.Closer
	Size() int64
}

// Open opens one file for reading.
func (o *Output) Open(ctx context.Context, f File) (Reader, error) {
	if o.client == nil {
		p := filepath.Join(o.dir, filepath.FromSlash(f.Rel))
		h, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		st, err := h.Stat()
		if err != nil {
			h.Close()
			return nil, err
		}
		return &localFile{File: h, size: st.Size()}, nil
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	key := o.target.Key(f.Rel)
	out, err := o.client.GetObject(gctx, &s3.GetObjectInput{Bucket: aws.String(o.target.Bucket), Key: aws.String(key)})
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s: %w", o.target.Bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, fmt.Errorf("get s3://%s/%s: %w", o.target.Bucket, key, err)
	}
	return memFile{bytes.NewReader(b)}, nil
}

type localFile struct {
	*os.File
	size int64
}

func (l *localFile) Size() int64 { return l.size }

type memFile struct{ *bytes.Reader }

func (memFile) Close() error { return nil }

// ReadRows streams the rows of one committed file of schema (its
// key-value metadata, schemas.MetadataKey) to add, 4096 at a time, decoded
// whole into T (parquet-go reconstructs whole rows faster than it converts
// to a struct of a few columns). It returns the rows read; every error
// names the file.
func ReadRows[T any](ctx context.Context, o *Output, f File, schema string, add func(*T)) (int64, error) {
	rd, err := o.Open(ctx, f)
	if err != nil {
		return 0, err
	}
	defer rd.Close()
	bad := func(err error) error {
		return fmt.Errorf("read %s: %w; it is not a complete %s Parquet file (the collector never leaves partial files): move it aside", o.Where(f), err, schema)
	}
	pf, err := pq.OpenFile(rd, rd.Size(), pq.SkipBloomFilters(true), pq.SkipPageIndex(true))
	if err != nil {
		return 0, bad(err)
	}
	if v, _ := pf.Lookup(schemas.MetadataKey); v != schema {
		return 0, bad(fmt.Errorf("key-value metadata %s=%q, want %q", schemas.MetadataKey, v, schema))
	}
	r := pq.NewGenericReader[T](pf)
	defer r.Close()
	buf := make([]T, 4096)
	var n int64
	for {
		k, err := r.Read(buf)
		for i := range buf[:k] {
			add(&buf[i])
		}
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, bad(err)
		}
	}
	if n != pf.NumRows() {
		return n, bad(fmt.Errorf("read %d rows, footer says %d", n, pf.NumRows()))
	}
	return n, nil
}
