package s3out

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/sinks/parquet"
)

// Options are the collaborators of a Store.
type Options struct {
	Logger *slog.Logger
	// Registry receives tapflow_s3_* metrics; nil registers none.
	Registry prometheus.Registerer
	// Client replaces the client built from Config (tests).
	Client *s3.Client
}

// Store is an S3 bucket prefix the collector uploads to. It implements
// parquet.Remote.
type Store struct {
	cfg    Config
	target Target
	log    *slog.Logger
	m      metrics

	once   sync.Mutex
	client *s3.Client

	// Multipart uploads this process left incomplete (an abort that
	// failed: S3 unreachable) by key → upload id, and the keys being
	// uploaded now (never aborted by AbortIncomplete).
	mu       sync.Mutex
	left     map[string]string
	inflight map[string]int
}

type metrics struct {
	objects  prometheus.Counter
	bytes    prometheus.Counter
	parts    prometheus.Counter
	failures prometheus.Counter
	seconds  prometheus.Histogram
	aborted  prometheus.Counter
	left     prometheus.Gauge
}

var _ parquet.Remote = (*Store)(nil)

// New validates cfg and output (s3://bucket/prefix); it performs no I/O
// and reads no credentials: the client is built on first use.
func New(output string, cfg Config, opts Options) (*Store, error) {
	t, err := ParseTarget(output)
	if err != nil {
		return nil, fmt.Errorf("collector.output: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("collector.s3: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Store{cfg: cfg, target: t, log: log.With("component", "s3out", "target", t.String(), "endpoint", endpointName(cfg)), client: opts.Client,
		left: map[string]string{}, inflight: map[string]int{}}
	s.m = metrics{
		objects:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_objects_uploaded_total", Help: "Objects stored in the S3 output."}),
		bytes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_bytes_uploaded_total", Help: "Bytes stored in the S3 output."}),
		parts:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_parts_uploaded_total", Help: "Multipart parts uploaded."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_upload_failures_total", Help: "Upload attempts that failed (each is retried)."}),
		seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tapflow_s3_upload_seconds", Help: "Time to store one object.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		aborted: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_multipart_aborted_total",
			Help: "Incomplete multipart uploads of this collector's files aborted (failed uploads, and leftovers of earlier runs found at start)."}),
		left: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_s3_incomplete_uploads",
			Help: "Incomplete multipart uploads this collector left in the bucket and could not abort yet (S3 unreachable); retried once S3 answers again."}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.m.objects, s.m.bytes, s.m.parts, s.m.failures, s.m.seconds, s.m.aborted, s.m.left} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("s3out: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

func endpointName(cfg Config) string {
	if cfg.Endpoint == "" {
		return "aws"
	}
	return cfg.Endpoint
}

// MaxBackoff is the longest wait between upload retries (the Parquet sink
// asks for it).
func (s *Store) MaxBackoff() time.Duration { return s.cfg.MaxBackoff.D() }

// String is the target, for logs.
func (s *Store) String() string { return s.target.String() }

// Target returns the parsed output.
func (s *Store) Target() Target { return s.target }

// Client returns the S3 client of the store, built on first use from the
// config and the AWS credential chain (readers such as tapflow report and
// audit list and get objects with it).
func (s *Store) Client(ctx context.Context) (*s3.Client, error) { return s.clientFor(ctx) }

// clientFor builds the client once (reading the credential chain).
func (s *Store) clientFor(ctx context.Context) (*s3.Client, error) {
	s.once.Lock()
	defer s.once.Unlock()
	if s.client != nil {
		return s.client, nil
	}
	var lo []func(*awsconfig.LoadOptions) error
	if s.cfg.Region != "" {
		lo = append(lo, awsconfig.WithRegion(s.cfg.Region))
	}
	if s.cfg.Profile != "" {
		lo = append(lo, awsconfig.WithSharedConfigProfile(s.cfg.Profile))
	}
	if s.cfg.CredentialsFile != "" {
		lo = append(lo, awsconfig.WithSharedCredentialsFiles([]string{s.cfg.CredentialsFile}))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, lo...)
	if err != nil {
		return nil, fmt.Errorf("s3 output %s: load AWS config (environment, profile %q, credentials file %q): %w", s.target, s.cfg.Profile, s.cfg.CredentialsFile, err)
	}
	if ac.Region == "" {
		ac.Region = "us-east-1"
	}
	c := s3.NewFromConfig(ac, func(o *s3.Options) {
		if s.cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(s.cfg.Endpoint)
		}
		o.UsePathStyle = s.cfg.PathStyle
	})
	source := "unknown"
	if ac.Credentials != nil {
		if cr, err := ac.Credentials.Retrieve(ctx); err == nil {
			source = cr.Source // e.g. EnvConfigCredentials, SharedConfigCredentials: never the keys
		} else {
			return nil, fmt.Errorf("s3 output %s: no usable credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or collector.s3.credentials_file): %w", s.target, err)
		}
	}
	s.log.Info("s3 output ready", "region", ac.Region, "path_style", s.cfg.PathStyle, "credentials_source", source)
	s.client = c
	return c, nil
}

// Upload stores the local file path as the object rel (relative to the
// output root, e.g. flows/dt=…/hour=…/x.parquet): one PUT up to PartSize,
// multipart above. It returns when the object is stored or on the first
// error (the caller retries).
func (s *Store) Upload(ctx context.Context, path, rel string) error {
	c, err := s.clientFor(ctx)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("s3 upload: open staged file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("s3 upload: %w", err)
	}
	key := s.target.Key(rel)
	s.mu.Lock()
	s.inflight[key]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.inflight[key]--; s.inflight[key] <= 0 {
			delete(s.inflight, key)
		}
		s.mu.Unlock()
	}()
	start := time.Now()
	if st.Size() <= int64(s.cfg.PartSize) {
		err = s.put(ctx, c, f, st.Size(), key)
	} else {
		err = s.multipart(ctx, c, f, st.Size(), key)
	}
	if err != nil {
		s.m.failures.Inc()
		return fmt.Errorf("s3 upload %s to s3://%s/%s (endpoint %s): %w", path, s.target.Bucket, key, endpointName(s.cfg), err)
	}
	s.m.objects.Inc()
	s.m.bytes.Add(float64(st.Size()))
	s.m.seconds.Observe(time.Since(start).Seconds())
	return nil
}

func (s *Store) put(ctx context.Context, c *s3.Client, f *os.File, size int64, key string) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.D())
	defer cancel()
	_, err := c.PutObject(rctx, &s3.PutObjectInput{
		Bucket: aws.String(s.target.Bucket), Key: aws.String(key),
		Body: io.NewSectionReader(f, 0, size), ContentLength: aws.Int64(size),
		ContentType: aws.String("application/vnd.apache.parquet"),
	})
	return err
}

func (s *Store) multipart(ctx context.Context, c *s3.Client, f *os.File, size int64, key string) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.D())
	// CRC32 per part, declared up front so the server verifies each part
	// and the completed object (the SDK computes it while sending).
	up, err := c.CreateMultipartUpload(rctx, &s3.CreateMultipartUploadInput{
		Bucket: aws.String(s.target.Bucket), Key: aws.String(key), ContentType: aws.String("application/vnd.apache.parquet"),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
	})
	cancel()
	if err != nil {
		return fmt.Errorf("create multipart upload: %w", err)
	}
	// A fresh context: the upload's may be what ended (a stop).
	abort := func() { s.abort(c, key, aws.ToString(up.UploadId)) }
	part := int64(s.cfg.PartSize)
	var parts []types.CompletedPart
	for n, off := int32(1), int64(0); off < size; n, off = n+1, off+part {
		l := min(part, size-off)
		pctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.D())
		out, err := c.UploadPart(pctx, &s3.UploadPartInput{
			Bucket: aws.String(s.target.Bucket), Key: aws.String(key), UploadId: up.UploadId, PartNumber: aws.Int32(n),
			Body: io.NewSectionReader(f, off, l), ContentLength: aws.Int64(l), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32,
		})
		cancel()
		if err != nil {
			abort()
			return fmt.Errorf("upload part %d: %w", n, err)
		}
		s.m.parts.Inc()
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n), ChecksumCRC32: out.ChecksumCRC32})
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.D())
	defer cancel()
	if _, err := c.CompleteMultipartUpload(cctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(s.target.Bucket), Key: aws.String(key), UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	}); err != nil {
		abort()
		return fmt.Errorf("complete multipart upload: %w", err)
	}
	return nil
}

// abort aborts one multipart upload with a fresh, bounded context; when it
// fails (S3 unreachable: the same outage that failed the upload) the
// upload is remembered, counted in tapflow_s3_incomplete_uploads and
// aborted by the next AbortIncomplete.
func (s *Store) abort(c *s3.Client, key, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), min(s.cfg.RequestTimeout.D(), 30*time.Second))
	defer cancel()
	_, err := c.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(s.target.Bucket), Key: aws.String(key), UploadId: aws.String(id)})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil && !isNoSuchUpload(err) {
		s.log.Warn("cannot abort a failed multipart upload now; retried once S3 answers again", "key", key, "err", err)
		s.left[key] = id
	} else {
		if err == nil { // NoSuchUpload: already gone (completed, or aborted by a lifecycle rule)
			s.m.aborted.Inc()
		}
		delete(s.left, key)
	}
	s.m.left.Set(float64(len(s.left)))
}

func isNoSuchUpload(err error) bool {
	var nsu *types.NoSuchUpload
	return errors.As(err, &nsu)
}

// AbortIncomplete aborts the incomplete multipart uploads of writer's
// files (<writer>-<first>-<last>[-n].parquet) under dir (flows, meters) of
// the output prefix, except those this process is uploading now: what an
// earlier run left when it died or lost S3 mid-upload, and what an abort
// during an outage could not remove. Other writers' uploads are never
// touched. It returns how many it aborted. The Parquet sink calls it when
// it starts and after an upload succeeds following failures; a sink
// uploads one file at a time, so none of its own is in flight then.
func (s *Store) AbortIncomplete(ctx context.Context, dir, writer string) (int, error) {
	c, err := s.clientFor(ctx)
	if err != nil {
		return 0, err
	}
	prefix := s.target.Key(dir) + "/"
	in := &s3.ListMultipartUploadsInput{Bucket: aws.String(s.target.Bucket), Prefix: aws.String(prefix)}
	type upload struct{ key, id string }
	var found []upload
	for {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout.D())
		out, err := c.ListMultipartUploads(lctx, in)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("list incomplete multipart uploads under s3://%s/%s: %w", s.target.Bucket, prefix, err)
		}
		for _, u := range out.Uploads {
			if key := aws.ToString(u.Key); ownFile(key, writer) {
				found = append(found, upload{key, aws.ToString(u.UploadId)})
			}
		}
		if !aws.ToBool(out.IsTruncated) || (aws.ToString(out.NextKeyMarker) == "" && aws.ToString(out.NextUploadIdMarker) == "") {
			break
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
	// Remembered uploads the listing no longer shows are gone already.
	s.mu.Lock()
	for key := range s.left {
		if strings.HasPrefix(key, prefix) && ownFile(key, writer) && !slices.ContainsFunc(found, func(u upload) bool { return u.key == key }) {
			delete(s.left, key)
		}
	}
	s.m.left.Set(float64(len(s.left)))
	s.mu.Unlock()
	n := 0
	for _, u := range found {
		s.mu.Lock()
		busy := s.inflight[u.key] > 0
		s.mu.Unlock()
		if busy {
			continue
		}
		s.abort(c, u.key, u.id)
		s.mu.Lock()
		_, failed := s.left[u.key]
		s.mu.Unlock()
		if failed {
			return n, fmt.Errorf("abort incomplete multipart upload of s3://%s/%s: S3 did not accept it", s.target.Bucket, u.key)
		}
		n++
	}
	if n > 0 {
		s.log.Info("aborted incomplete multipart uploads left by failed uploads or an earlier run", "dir", dir, "writer", writer, "uploads", n)
	}
	return n, nil
}

// ownFile reports whether key names a file the sink's writer uploads:
// …/<writer>-<20 digits>-<20 digits>[-n].parquet.
func ownFile(key, writer string) bool {
	name := key[strings.LastIndexByte(key, '/')+1:]
	rest, ok := strings.CutPrefix(name, writer+"-")
	if !ok {
		return false
	}
	rest, ok = strings.CutSuffix(rest, ".parquet")
	if !ok || len(rest) < 41 || rest[20] != '-' || !digits(rest[:20]) || !digits(rest[21:41]) {
		return false
	}
	return len(rest) == 41 || (rest[41] == '-' && digits(rest[42:]))
}

func digits(v string) bool {
	for _, r := range v {
		if r < '0' || r > '9' {
			return false
		}
	}
	return v != ""
}

// List implements parquet.Committed: the .parquet objects of a partition
// (rel like flows/dt=…/hour=…).
func (s *Store) List(rel string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout.D())
	defer cancel()
	c, err := s.clientFor(ctx)
	if err != nil {
		return nil, err
	}
	prefix := s.target.Key(rel) + "/"
	var names []string
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(s.target.Bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list s3://%s/%s: %w", s.target.Bucket, prefix, err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), prefix)
			if !strings.Contains(name, "/") && strings.HasSuffix(name, ".parquet") && !strings.HasPrefix(name, ".") {
				names = append(names, name)
			}
		}
	}
	return names, nil
}

// Batches implements parquet.Committed: MetadataBatches from the object's
// footer, read with ranged GETs.
func (s *Store) Batches(rel, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout.D())
	defer cancel()
	c, err := s.clientFor(ctx)
	if err != nil {
		return "", err
	}
	key := s.target.Key(rel + "/" + name)
	h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.target.Bucket), Key: aws.String(key)})
	if err != nil {
		return "", fmt.Errorf("head s3://%s/%s: %w", s.target.Bucket, key, err)
	}
	return parquet.FooterBatches(&rangeReader{ctx: ctx, c: c, bucket: s.target.Bucket, key: key}, aws.ToInt64(h.ContentLength))
}

// rangeReader is an io.ReaderAt over an object (one ranged GET per call).
type rangeReader struct {
	ctx         context.Context
	c           *s3.Client
	bucket, key string
}

func (r *rangeReader) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	out, err := r.c.GetObject(r.ctx, &s3.GetObjectInput{Bucket: aws.String(r.bucket), Key: aws.String(r.key),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+int64(len(p))-1))})
	if err != nil {
		return 0, err
	}
	defer out.Body.Close()
	n, err := io.ReadFull(out.Body, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return n, err
}
