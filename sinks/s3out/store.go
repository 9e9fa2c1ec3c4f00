package s3out

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
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
}

type metrics struct {
	objects  prometheus.Counter
	bytes    prometheus.Counter
	parts    prometheus.Counter
	failures prometheus.Counter
	seconds  prometheus.Histogram
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
	s := &Store{cfg: cfg, target: t, log: log.With("component", "s3out", "target", t.String(), "endpoint", endpointName(cfg)), client: opts.Client}
	s.m = metrics{
		objects:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_objects_uploaded_total", Help: "Objects stored in the S3 output."}),
		bytes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_bytes_uploaded_total", Help: "Bytes stored in the S3 output."}),
		parts:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_parts_uploaded_total", Help: "Multipart parts uploaded."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_s3_upload_failures_total", Help: "Upload attempts that failed (each is retried)."}),
		seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tapflow_s3_upload_seconds", Help: "Time to store one object.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.m.objects, s.m.bytes, s.m.parts, s.m.failures, s.m.seconds} {
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
	abort := func() {
		actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, aerr := c.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: aws.String(s.target.Bucket), Key: aws.String(key), UploadId: up.UploadId}); aerr != nil {
			s.log.Warn("abort of a failed multipart upload failed; a bucket lifecycle rule (AbortIncompleteMultipartUpload) cleans it", "key", key, "err", aerr)
		}
	}
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
