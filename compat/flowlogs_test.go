package compat

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/billing/flowlogs"
	idataset "github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
)

// TestFlowLogsReadBack: tenant flow logs delivered to a real S3 server
// (versitygw), copied down with the keys as paths, read in DuckDB with
// hive partitioning: the AWS Parquet flow-log columns have the types of
// AWS's Athena table for them, the hour's partitions read as year, month,
// day and hour, and each project's bytes, packets and records equal the
// source's for that hour (DuckDB over the collector output).
func TestFlowLogsReadBack(t *testing.T) {
	hour := time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)
	dir := writeOutput(t, dataset(), 1000)
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "tenant-logs")
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+versitygw.AccessKey+"\naws_secret_access_key = "+versitygw.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := flowlogs.DefaultConfig()
	cfg.Location, cfg.StagingDir = "s3://tenant-logs/{project_id}", t.TempDir()
	cfg.S3.Endpoint, cfg.S3.Region, cfg.S3.PathStyle, cfg.S3.CredentialsFile = srv.Endpoint, versitygw.Region, true, creds
	src, err := idataset.Open(context.Background(), dir, idataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := flowlogs.New(cfg, src, flowlogs.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Deliver(context.Background(), hour)
	if err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	for key := range srv.Objects(t, "tenant-logs", "") {
		p := filepath.Join(local, filepath.FromSlash(key))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, srv.Get(t, "tenant-logs", key), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db := openDB(t)
	logs := fmt.Sprintf("read_parquet('%s', hive_partitioning = true)", filepath.Join(local, "*", "year=*", "month=*", "day=*", "hour=*", "*.parquet"))
	// The types of AWS's Athena DDL for Parquet flow logs (protocol: int
	// here, which Athena reads as its bigint).
	want := map[string]string{
		"version": "INTEGER", "account_id": "VARCHAR", "interface_id": "VARCHAR", "srcaddr": "VARCHAR", "dstaddr": "VARCHAR",
		"srcport": "INTEGER", "dstport": "INTEGER", "protocol": "INTEGER", "packets": "BIGINT", "bytes": "BIGINT",
		"start": "BIGINT", "end": "BIGINT", "log_status": "VARCHAR", "instance_id": "VARCHAR", "tcp_flags": "INTEGER", "type": "VARCHAR",
		"pkt_srcaddr": "VARCHAR", "pkt_dstaddr": "VARCHAR", "flow_direction": "VARCHAR", "traffic_path": "INTEGER",
		"time_end": "TIMESTAMP WITH TIME ZONE", "zone": "VARCHAR", "external_network": "VARCHAR", "lb_id": "VARCHAR",
	}
	types := map[string]string{}
	for _, r := range query(t, db, "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM "+logs+")") {
		k, v, _ := strings.Cut(r, "|")
		types[k] = v
	}
	for col, typ := range want {
		if types[col] != typ {
			t.Errorf("column %s: %q, want %s", col, types[col], typ)
		}
	}
	for _, col := range []string{"year", "month", "day", "hour"} {
		if types[col] == "" {
			t.Errorf("no hive partition column %s: %v", col, types)
		}
	}
	got := query(t, db, `SELECT account_id, year, month, day, hour, count(*), sum(packets), sum(bytes), min("end") >= `+fmt.Sprint(hour.Unix())+`, max("end") < `+fmt.Sprint(hour.Add(time.Hour).Unix())+`
		FROM `+logs+` GROUP BY ALL ORDER BY account_id`)
	wantRows := query(t, db, fmt.Sprintf(`SELECT tenant_id, 2026, 11, 29, 23, count(*), sum(packets), sum(bytes), true, true
		FROM read_parquet('%s') WHERE time_end >= '%s' AND time_end < '%s' AND tenant_id <> 'unknown' GROUP BY ALL ORDER BY tenant_id`,
		glob(dir), hour.Format(time.RFC3339), hour.Add(time.Hour).Format(time.RFC3339)))
	t.Logf("DuckDB, per project: account_id|year|month|day|hour|records|packets|bytes|end in hour:\n%s", strings.Join(got[:3], "\n"))
	if strings.Join(got, "\n") != strings.Join(wantRows, "\n") || len(got) != len(res.Projects) || len(got) < 10 {
		t.Errorf("DuckDB on the delivered objects (%d projects delivered):\n%s\nwant (the collector output):\n%s", len(res.Projects), strings.Join(got, "\n"), strings.Join(wantRows, "\n"))
	}
}
