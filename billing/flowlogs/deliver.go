package flowlogs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	pq "github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
)

// Options are the collaborators of a Deliverer.
type Options struct {
	Logger *slog.Logger
	// Registry receives the tapflow_flowlogs_* metrics; nil registers none.
	Registry prometheus.Registerer
	// Client replaces the S3 client built from Config.S3 (tests).
	Client *s3.Client
}

// Deliverer delivers closed hours of a collector output to the projects'
// locations.
type Deliverer struct {
	cfg   Config
	src   *dataset.Output
	log   *slog.Logger
	m     metrics
	codec compress.Codec

	mu     sync.Mutex
	client *s3.Client // built by the first upload when nil
}

type metrics struct {
	deliveries *prometheus.CounterVec
	failures   prometheus.Counter
	perProject *prometheus.CounterVec
	records    prometheus.Counter
	bytes      prometheus.Counter
	objBytes   prometheus.Counter
	skipped    *prometheus.CounterVec
	hours      prometheus.Counter
	hoursFail  prometheus.Counter
	seconds    prometheus.Histogram
}

// Reasons a record of the hour is not delivered (tapflow_flowlogs_records_skipped_total).
const (
	SkipUnknownTenant = "unknown_tenant" // tenant_id unknown: no project to deliver to
	SkipNotListed     = "not_listed"     // the project is not in billing.flow_logs.projects
)

// New validates cfg and the source (the collector output whose flows/ it
// reads) and registers the metrics; it performs no I/O and starts nothing.
func New(cfg Config, src *dataset.Output, opts Options) (*Deliverer, error) {
	if !cfg.Enabled() {
		return nil, errors.New("billing.flow_logs.location is empty; set it, e.g. s3://flowlogs-{project_id}/tapflow")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("billing.flow_logs: %w", err)
	}
	if cfg.StagingDir == "" {
		return nil, errors.New("billing.flow_logs.staging_dir is empty; set it (the config loader derives <data_dir>/flowlogs-staging)")
	}
	if src == nil {
		return nil, errors.New("flowlogs: no source output; open the collector output (collector.output) first")
	}
	codec, err := parquet.Codec(cfg.Compression)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Deliverer{cfg: cfg, src: src, log: log.With("component", "billing/flowlogs"), codec: codec, client: opts.Client}
	d.m = metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_flowlogs_deliveries_total",
			Help: "Hourly flow-log objects delivered to a project's location (a re-delivery of an hour counts again)."}, []string{"project_id"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_flowlogs_delivery_failures_total",
			Help: "Hourly flow-log deliveries to a project's location that failed (bucket missing, access denied, S3 down); the hour is delivered again on the next attempt."}),
		perProject: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_flowlogs_project_failures_total",
			Help: "tapflow_flowlogs_delivery_failures_total by project (series of billing.flow_logs.projects from the start, of other projects from their first failure)."}, []string{"project_id"}),
		records: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_flowlogs_records_total", Help: "Flow records delivered to projects."}),
		bytes:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_flowlogs_flow_bytes_total", Help: "Traffic bytes (L2, the bytes column) of the flow records delivered."}),
		objBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_flowlogs_object_bytes_total",
			Help: "Size of the Parquet objects delivered."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_flowlogs_records_skipped_total",
			Help: "Flow records of a delivered hour not delivered to any project, by reason (unknown_tenant: no project; not_listed: the project is not in billing.flow_logs.projects)."}, []string{"reason"}),
		hours:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_flowlogs_hours_delivered_total", Help: "Hours delivered to every project."}),
		hoursFail: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_flowlogs_hours_failed_total", Help: "Hour deliveries with at least one failed project or a source read error."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tapflow_flowlogs_delivery_seconds", Help: "Time to deliver one hour to every project.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}),
	}
	for _, p := range cfg.Projects { // at 0 from start
		d.m.deliveries.WithLabelValues(p)
		d.m.perProject.WithLabelValues(p)
	}
	d.m.skipped.WithLabelValues(SkipUnknownTenant)
	d.m.skipped.WithLabelValues(SkipNotListed)
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{d.m.deliveries, d.m.failures, d.m.perProject, d.m.records, d.m.bytes, d.m.objBytes, d.m.skipped, d.m.hours, d.m.hoursFail, d.m.seconds} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("flowlogs: register metrics: %w", err)
			}
		}
	}
	return d, nil
}

// Project is what one project got for an hour.
type Project struct {
	ID string
	// URL is the object delivered (s3://bucket/key); "" when it failed.
	URL                     string
	Records, Packets, Bytes int64
	// Size is the object's size.
	Size int64
	// Err is why the delivery failed (nil: delivered).
	Err error
}

// Result is one hour's delivery.
type Result struct {
	Hour time.Time
	// Projects are the projects with records in the hour (sorted by ID).
	Projects []Project
	// Files and SourceRecords are the hour's source files and their rows;
	// Skipped counts the hour's records not delivered, by reason.
	Files         int
	SourceRecords int64
	Skipped       map[string]int64
}

// Key is the object key of a project's hour below its location's prefix:
// year=YYYY/month=MM/day=DD/hour=HH/<project>_tapflow_<YYYYMMDDTHH>00Z.parquet
// (Hive partitions like AWS's hourly ones; one object per project and hour,
// so a re-delivery overwrites it).
func Key(project string, hour time.Time) string {
	h := hour.UTC()
	return h.Format("year=2006/month=01/day=02/hour=15/") + project + "_tapflow_" + h.Format("20060102T15") + "00Z.parquet"
}

// maxBuffered bounds the rows held in memory across every project's open
// row group; past it every open row group is flushed.
const maxBuffered = 1 << 20

// Deliver writes each project's records of hour (time_end in [hour,
// hour+1h)) to its location, one object per project, and returns what
// each project got. The caller decides that the hour is closed and
// audited. Delivering an hour again overwrites the same keys (a late
// record or a correction is delivered by delivering the hour again). A
// project that fails does not stop the others; the error joins every
// failure, each naming the project and the fix.
func (d *Deliverer) Deliver(ctx context.Context, hour time.Time) (Result, error) {
	hour = hour.UTC()
	res := Result{Hour: hour, Skipped: map[string]int64{}}
	if !hour.Equal(hour.Truncate(time.Hour)) {
		return res, fmt.Errorf("flowlogs: hour %s is not a whole hour; pass e.g. %s", hour.Format(time.RFC3339Nano), hour.Truncate(time.Hour).Format("2006-01-02T15"))
	}
	d.mu.Lock() // one delivery at a time per Deliverer
	defer d.mu.Unlock()
	start := time.Now()
	dir, err := d.stage()
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ws, err := d.write(ctx, hour, dir, &res)
	defer func() {
		for _, w := range ws {
			w.discard()
		}
	}()
	if err != nil {
		d.m.hoursFail.Inc()
		return res, err
	}
	ids := make([]string, 0, len(ws))
	for id := range ws {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var errs []error
	for _, id := range ids {
		w := ws[id]
		p := Project{ID: id, Records: w.records, Packets: w.packets, Bytes: w.bytes}
		p.URL, p.Size, p.Err = d.upload(ctx, id, hour, w)
		if p.Err != nil {
			p.URL = ""
			d.m.failures.Inc()
			d.m.perProject.WithLabelValues(id).Inc()
			errs = append(errs, p.Err)
		} else {
			d.m.deliveries.WithLabelValues(id).Inc()
			d.m.records.Add(float64(p.Records))
			d.m.bytes.Add(float64(p.Bytes))
			d.m.objBytes.Add(float64(p.Size))
		}
		res.Projects = append(res.Projects, p)
	}
	for reason, n := range res.Skipped {
		d.m.skipped.WithLabelValues(reason).Add(float64(n))
	}
	d.m.seconds.Observe(time.Since(start).Seconds())
	if len(errs) > 0 {
		d.m.hoursFail.Inc()
		d.log.Warn("flow logs of an hour not delivered to every project; deliver the hour again once fixed", "hour", hour.Format("2006-01-02T15"), "failed", len(errs), "projects", len(ids))
		return res, errors.Join(errs...)
	}
	d.m.hours.Inc()
	d.log.Info("flow logs delivered", "hour", hour.Format("2006-01-02T15"), "projects", len(ids), "records", res.SourceRecords-res.Skipped[SkipUnknownTenant]-res.Skipped[SkipNotListed],
		"files", res.Files, "seconds", time.Since(start).Seconds())
	return res, nil
}

// projectFile is one project's Parquet file being written in the staging
// directory.
type projectFile struct {
	f                       *os.File
	w                       *pq.GenericWriter[Record]
	buffered                int
	records, packets, bytes int64
}

func (p *projectFile) discard() {
	if p.f != nil {
		p.f.Close()
		os.Remove(p.f.Name())
		p.f = nil
	}
}

// write reads the hour's source files and writes every wanted project's
// rows to its own staging file; the files are complete when it returns
// without error.
func (d *Deliverer) write(ctx context.Context, hour time.Time, dir string, res *Result) (map[string]*projectFile, error) {
	ws := map[string]*projectFile{}
	// Only the hour's partition is listed (not every hour of the output).
	part := hour.Format("dt=2006-01-02/hour=15")
	files, err := d.src.List(ctx, "flows/"+part)
	if errors.Is(err, dataset.ErrNoDir) {
		return ws, nil // no record of the hour: nothing to deliver
	}
	if err != nil {
		return ws, fmt.Errorf("flowlogs: %w", err)
	}
	from, to := hour.UnixMicro(), hour.Add(time.Hour).UnixMicro()
	buffered := 0
	var werr error
	add := func(f *schemas.Flow) {
		if werr != nil || f.TimeEnd < from || f.TimeEnd >= to {
			return
		}
		switch {
		case f.TenantID == schemas.UnknownTenant || f.TenantID == "":
			res.Skipped[SkipUnknownTenant]++
			return
		case !d.cfg.wants(f.TenantID):
			res.Skipped[SkipNotListed]++
			return
		}
		w := ws[f.TenantID]
		if w == nil {
			if w, werr = d.open(dir); werr != nil {
				return
			}
			ws[f.TenantID] = w
		}
		if _, werr = w.w.Write([]Record{toRecord(f)}); werr != nil {
			werr = fmt.Errorf("flowlogs: write %s: %w", w.f.Name(), werr)
			return
		}
		w.records++
		w.packets += f.Packets
		w.bytes += f.Bytes
		w.buffered++
		buffered++
		if w.buffered >= d.cfg.RowGroupRows { // the writer flushed the row group itself
			buffered -= w.buffered
			w.buffered = 0
		}
		if buffered >= maxBuffered {
			for _, o := range ws {
				if o.buffered > 0 {
					if werr = o.w.Flush(); werr != nil {
						werr = fmt.Errorf("flowlogs: write %s: %w", o.f.Name(), werr)
						return
					}
					o.buffered = 0
				}
			}
			buffered = 0
		}
	}
	for _, f := range files {
		if f.Partition() != part {
			continue
		}
		res.Files++
		n, err := dataset.ReadRows(ctx, d.src, f, schemas.SchemaName, add)
		res.SourceRecords += n
		if err != nil {
			return ws, fmt.Errorf("flowlogs: %w", err)
		}
		if werr != nil {
			return ws, werr
		}
	}
	for _, w := range ws {
		if err := w.w.Close(); err != nil {
			return ws, fmt.Errorf("flowlogs: write %s: %w", w.f.Name(), err)
		}
		if err := w.f.Sync(); err != nil {
			return ws, fmt.Errorf("flowlogs: write %s: %w", w.f.Name(), err)
		}
	}
	return ws, nil
}

// staleStaging is the age past which a delivery's staging directory is
// a crashed process's (a delivery of an hour takes minutes).
const staleStaging = 24 * time.Hour

// stage makes this delivery's own directory in the staging directory (a
// CLI run and the billing loop may share it), and removes those that
// crashed deliveries left.
func (d *Deliverer) stage() (string, error) {
	if err := os.MkdirAll(d.cfg.StagingDir, 0o700); err != nil {
		return "", fmt.Errorf("flowlogs: staging_dir: %w", err)
	}
	old, _ := filepath.Glob(filepath.Join(d.cfg.StagingDir, ".deliver-*"))
	for _, o := range old {
		if st, err := os.Stat(o); err == nil && time.Since(st.ModTime()) > staleStaging {
			d.log.Info("removing a crashed delivery's staging files", "dir", o)
			_ = os.RemoveAll(o)
		}
	}
	dir, err := os.MkdirTemp(d.cfg.StagingDir, ".deliver-*")
	if err != nil {
		return "", fmt.Errorf("flowlogs: staging_dir: %w", err)
	}
	return dir, nil
}

// open starts a project's staging file (0600: another tenant's records).
func (d *Deliverer) open(dir string) (*projectFile, error) {
	f, err := os.CreateTemp(dir, "project-*.parquet")
	if err != nil {
		return nil, fmt.Errorf("flowlogs: staging file: %w", err)
	}
	w := pq.NewGenericWriter[Record](f,
		pq.Compression(d.codec),
		pq.KeyValueMetadata(schemas.MetadataKey, SchemaName),
		pq.MaxRowsPerRowGroup(int64(d.cfg.RowGroupRows)),
		pq.PageBufferSize(64<<10),
	)
	return &projectFile{f: f, w: w}, nil
}

// upload stores a project's file as its hour's object.
func (d *Deliverer) upload(ctx context.Context, project string, hour time.Time, w *projectFile) (string, int64, error) {
	t, err := d.cfg.target(project)
	if err != nil {
		return "", 0, fmt.Errorf("project %s: billing.flow_logs.location: %w; give the project an ID-safe location or leave it out of billing.flow_logs.projects", project, err)
	}
	store, err := s3out.New(t.String(), d.cfg.S3, s3out.Options{Logger: d.log, Client: d.client})
	if err != nil {
		return "", 0, fmt.Errorf("project %s: %w", project, err)
	}
	if d.client == nil {
		if d.client, err = store.Client(ctx); err != nil {
			return "", 0, fmt.Errorf("project %s: %w", project, err)
		}
	}
	st, err := w.f.Stat()
	if err != nil {
		return "", 0, fmt.Errorf("project %s: %w", project, err)
	}
	key := Key(project, hour)
	url := "s3://" + t.Bucket + "/" + t.Key(key)
	if err := store.Upload(ctx, w.f.Name(), key); err != nil {
		return "", 0, explain(project, t, err)
	}
	return url, st.Size(), nil
}

// explain wraps an upload error with what to do about it.
func explain(project string, t s3out.Target, err error) error {
	var api smithy.APIError
	code := ""
	if errors.As(err, &api) {
		code = api.ErrorCode()
	}
	switch code {
	case "NoSuchBucket":
		return fmt.Errorf("project %s: bucket %s does not exist; create it for the project (its location %s) or leave the project out of billing.flow_logs.projects: %w",
			project, t.Bucket, t, err)
	case "AccessDenied", "AllAccessDisabled":
		return fmt.Errorf("project %s: access denied writing to %s; grant the delivering credential (billing.flow_logs.s3) s3:PutObject and s3:AbortMultipartUpload on arn:aws:s3:::%s/* in the bucket policy of the project's location: %w",
			project, t, t.Bucket+prefixPath(t), err)
	case "InvalidAccessKeyId", "SignatureDoesNotMatch":
		return fmt.Errorf("project %s: the S3 server refused the delivering credential (%s); check billing.flow_logs.s3 (profile, credentials_file) and the keys in it: %w", project, code, err)
	}
	return fmt.Errorf("project %s: %w; the hour is delivered again on the next attempt", project, err)
}

func prefixPath(t s3out.Target) string {
	if t.Prefix == "" {
		return ""
	}
	return "/" + t.Prefix
}
