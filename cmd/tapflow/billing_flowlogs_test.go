package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/schemas"
)

// TestFlowlogsDeliverCLI runs `tapflow billing flowlogs deliver` with a config
// file (collector output on disk, locations on a real S3 server, the
// delivering credential in a credentials file) and checks its exit codes,
// its table and the objects it stored.
func TestFlowlogsDeliverCLI(t *testing.T) {
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "tenant-logs")
	data := t.TempDir()
	h := time.Date(2026, 12, 4, 5, 0, 0, 0, time.UTC)
	recs := parquettest.Flows(parquettest.Spec{Records: 2000, Tenants: 2, Start: h.Add(-10 * time.Minute), Span: 80 * time.Minute})
	dir := filepath.Join(data, "flows", "dt=2026-12-04", "hour=05")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "c1-1-1.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	w := pq.NewGenericWriter[schemas.Flow](f, pq.KeyValueMetadata(schemas.MetadataKey, schemas.SchemaName))
	want := map[string]int64{} // project → records of the hour
	for _, r := range recs {
		if r.TimeEnd >= h.UnixMicro() && r.TimeEnd < h.Add(time.Hour).UnixMicro() {
			if _, err := w.Write([]schemas.Flow{r}); err != nil {
				t.Fatal(err)
			}
			if r.TenantID != schemas.UnknownTenant {
				want[r.TenantID]++
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+versitygw.AccessKey+"\naws_secret_access_key = "+versitygw.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := func(location string) string {
		p := filepath.Join(t.TempDir(), "tapflow.yaml")
		y := fmt.Sprintf("data_dir: %s\nbilling:\n  flow_logs:\n    location: %q\n    s3:\n      endpoint: %s\n      region: %s\n      path_style: true\n      credentials_file: %s\n",
			data, location, srv.Endpoint, versitygw.Region, creds)
		if location == "" {
			y = fmt.Sprintf("data_dir: %s\n", data)
		}
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := conf("s3://tenant-logs/{project_id}")
	cases := []struct {
		name string
		args []string
		code int
		out  []string // in stdout (stderr for failures)
	}{
		{"delivers every project", []string{"--hour", "2026-12-04T05", "--config", good}, 0, []string{"hour 2026-12-04T05Z: 1 source files", "s3://tenant-logs/"}},
		{"again: idempotent", []string{"--hour", "2026-12-04T05", "--config", good}, 0, []string{"s3://tenant-logs/"}},
		{"hour not over", []string{"--hour", time.Now().UTC().Format("2006-01-02T15"), "--config", good}, 2, []string{"is not over yet"}},
		{"not a whole hour", []string{"--hour", "2026-12-04T05:30", "--config", good}, 2, []string{"not a whole hour"}},
		{"no config", []string{"--hour", "2026-12-04T05"}, 2, []string{"--config FILE is required"}},
		{"no location", []string{"--hour", "2026-12-04T05", "--config", conf("")}, 2, []string{"billing.flow_logs.location is not set"}},
		{"bad location", []string{"--hour", "2026-12-04T05", "--config", conf("s3://tenant-logs/all")}, 2, []string{"billing.flow_logs.location", "{project_id}"}},
		{"bucket missing", []string{"--hour", "2026-12-04T05", "--config", conf("s3://no-such-{project_id}/x")}, 1, []string{"does not exist; create it", "FAILED"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"billing", "flowlogs", "deliver"}, tc.args...), &stdout, &stderr)
			all := stdout.String() + stderr.String()
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, all)
			}
			for _, s := range tc.out {
				if !strings.Contains(all, s) {
					t.Errorf("output does not say %q:\n%s", s, all)
				}
			}
			if strings.Contains(all, versitygw.SecretKey) {
				t.Errorf("output shows the secret key")
			}
		})
	}
	objs := srv.Objects(t, "tenant-logs", "")
	if len(objs) != len(want) {
		t.Fatalf("objects %v, want one per project %v", objs, want)
	}
	for p, n := range want {
		key := p + "/" + flowlogs.Key(p, h)
		if objs[key] == 0 {
			t.Errorf("no object %s for project %s (%d records): %v", key, p, n, objs)
		}
	}
}
