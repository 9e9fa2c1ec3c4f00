package flowlogs

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/committest"
	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// BenchmarkDeliver delivers one hour of 200,000 records of 50 projects
// from a local collector output to a real S3 server (versitygw, one
// bucket, a prefix per project): records/s is the hour's records over the
// time to read, split, write and upload them.
func BenchmarkDeliver(b *testing.B) {
	recs := parquettest.Flows(parquettest.Spec{Records: 200_000, Tenants: 50, Ports: 2000, Start: hour, Span: time.Hour - time.Second})
	dir := b.TempDir()
	cfg := parquet.DefaultConfig()
	cfg.Output, cfg.Writer = dir, "c1"
	committest.Flows(b, recs, cfg, parquet.Options{Node: "c1", Logger: quiet})
	srv := versitygw.Start(b, "")
	srv.MakeBucket(b, "tenant-logs")
	fcfg := DefaultConfig()
	fcfg.Location, fcfg.StagingDir = "s3://tenant-logs/{project_id}", b.TempDir()
	fcfg.S3.Endpoint, fcfg.S3.Region, fcfg.S3.PathStyle = srv.Endpoint, versitygw.Region, true
	fcfg.S3.CredentialsFile = credentialsFile(b, versitygw.AccessKey, versitygw.SecretKey)
	src, err := dataset.Open(context.Background(), dir, dataset.Options{})
	if err != nil {
		b.Fatal(err)
	}
	d, err := New(fcfg, src, Options{Logger: quiet, Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var res Result
	for range b.N {
		if res, err = d.Deliver(context.Background(), hour); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(res.SourceRecords)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(len(res.Projects)), "projects")
}
