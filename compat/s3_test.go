package compat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
)

// TestS3OutputReadsBack: the collector's S3 output (a real versitygw),
// copied down object by object with the keys as paths, reads in DuckDB
// exactly like a local output (DuckDB's httpfs is not available offline,
// so the test queries the copies). Every record once, same sums, every
// object in the hive layout under the prefix.
func TestS3OutputReadsBack(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", versitygw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", versitygw.SecretKey)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "lake")
	scfg := s3out.DefaultConfig()
	scfg.Endpoint, scfg.PathStyle, scfg.Region = srv.Endpoint, true, versitygw.Region
	scfg.PartSize = 5 << 20
	st, err := s3out.New("s3://lake/billing/v1", scfg, s3out.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := dataset()
	// One agent batch per message, as the transport delivers them.
	for i := range recs {
		recs[i].AgentID, recs[i].BatchSeq, recs[i].RecordIndex = "agent-s3", int64(i/1000)+1, int32(i%1000)
	}
	cfg := parquet.DefaultConfig()
	cfg.Output, cfg.StagingDir, cfg.Writer = "s3://lake/billing/v1", t.TempDir(), "compat"
	sink, err := parquet.New(cfg, parquet.Options{Node: "compat", Remote: st, Dedupe: true})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch, len(recs)/1000+1)
	for i := 0; i < len(recs); i += 1000 {
		b := pipeline.NewBatch(slices.Clone(recs[i:min(i+1000, len(recs))]), func(err error) {
			if err != nil {
				t.Errorf("batch failed: %v", err)
			}
		})
		b.Seq = int64(i/1000 + 1)
		in <- b
	}
	close(in)
	if err := sink.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	objs := srv.Objects(t, "lake", "billing/v1/")
	if len(objs) < 4 {
		t.Fatalf("%d objects, want at least one per hour (4)", len(objs))
	}
	for key := range objs {
		rel, ok := cutPrefix(key, "billing/v1/")
		if !ok {
			t.Fatalf("object %s outside the prefix", key)
		}
		p := filepath.Join(local, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, srv.Get(t, "lake", key), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var wantBytes int64
	for _, r := range recs {
		wantBytes += r.Bytes
	}
	db := openDB(t)
	got := query(t, db, fmt.Sprintf(`SELECT count(*), count(DISTINCT (agent_id, batch_seq, record_index)), sum(bytes), count(DISTINCT dt), count(DISTINCT (dt, hour))
		FROM read_parquet('%s', hive_partitioning = true)`, glob(local)))
	want := fmt.Sprintf("%d|%d|%d|2|4", len(recs), len(recs), wantBytes)
	if len(got) != 1 || got[0] != want {
		t.Fatalf("DuckDB on the S3 objects: %v, want %s", got, want)
	}
	_ = schemas.SchemaName
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) < len(p) || s[:len(p)] != p {
		return "", false
	}
	return s[len(p):], true
}
