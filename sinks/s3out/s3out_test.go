package s3out_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
)

var quiet = slog.New(slog.DiscardHandler)

// isolate points the AWS config chain at nothing but what the test sets,
// and never at an instance metadata service.
func isolate(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

func envCreds(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", versitygw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", versitygw.SecretKey)
}

func store(t *testing.T, srv *versitygw.Server, output string, mod func(*s3out.Config)) *s3out.Store {
	t.Helper()
	cfg := s3out.DefaultConfig()
	cfg.Endpoint, cfg.PathStyle, cfg.Region = srv.Endpoint, true, versitygw.Region
	cfg.PartSize = 5 << 20
	cfg.RequestTimeout = units.Duration(5 * time.Second)
	if mod != nil {
		mod(&cfg)
	}
	st, err := s3out.New(output, cfg, s3out.Options{Logger: quiet, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func get(t *testing.T, srv *versitygw.Server, bucket, key string) []byte {
	t.Helper()
	out, err := srv.Client().GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	b, _ := io.ReadAll(out.Body)
	return b
}

func TestUpload(t *testing.T) {
	isolate(t)
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "flows")
	dir := t.TempDir()
	credFile := filepath.Join(dir, "credentials")
	if err := os.WriteFile(credFile, []byte("[default]\naws_access_key_id = "+versitygw.AccessKey+"\naws_secret_access_key = "+versitygw.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		size  int
		creds func(t *testing.T) func(*s3out.Config)
	}{
		{"single PUT, env credentials", 3 << 20, func(t *testing.T) func(*s3out.Config) { envCreds(t); return nil }},
		{"multipart 12 MiB in 5 MiB parts, credentials file", 12<<20 + 12345, func(t *testing.T) func(*s3out.Config) {
			return func(c *s3out.Config) { c.CredentialsFile = credFile }
		}},
		{"exactly one part", 5 << 20, func(t *testing.T) func(*s3out.Config) { envCreds(t); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := store(t, srv, "s3://flows/tenant-a/prod", tc.creds(t))
			body := make([]byte, tc.size)
			_, _ = rand.Read(body)
			p := filepath.Join(t.TempDir(), "x.parquet")
			if err := os.WriteFile(p, body, 0o644); err != nil {
				t.Fatal(err)
			}
			rel := "flows/dt=2026-11-29/hour=10/w-1-2.parquet"
			if err := st.Upload(context.Background(), p, rel); err != nil {
				t.Fatal(err)
			}
			if got := get(t, srv, "flows", "tenant-a/prod/"+rel); !bytes.Equal(got, body) {
				t.Fatalf("object differs: %d bytes, want %d", len(got), len(body))
			}
			names, err := st.List("flows/dt=2026-11-29/hour=10")
			if err != nil || !slices.Contains(names, "w-1-2.parquet") {
				t.Fatalf("list: %v %v", names, err)
			}
		})
	}
}

// TestUploadErrorsNameTheFixAndNoSecret: bad credentials and an
// unreachable endpoint give errors with the target and endpoint, never the
// secret key.
func TestUploadErrorsNameTheFixAndNoSecret(t *testing.T) {
	isolate(t)
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "flows")
	p := filepath.Join(t.TempDir(), "x.parquet")
	_ = os.WriteFile(p, []byte("PAR1"), 0o644)
	for _, tc := range []struct {
		name, secret string
		mod          func(*s3out.Config)
		want         string
	}{
		{"wrong secret", "not-the-secret-0123456789", nil, "s3://flows"},
		{"endpoint down", versitygw.SecretKey, func(c *s3out.Config) { c.Endpoint = "http://127.0.0.1:1" }, "127.0.0.1:1"},
		{"missing bucket", versitygw.SecretKey, nil, "no-such-bucket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_ACCESS_KEY_ID", versitygw.AccessKey)
			t.Setenv("AWS_SECRET_ACCESS_KEY", tc.secret)
			out := "s3://flows/x"
			if tc.name == "missing bucket" {
				out = "s3://no-such-bucket/x"
			}
			st := store(t, srv, out, func(c *s3out.Config) {
				c.RequestTimeout = units.Duration(2 * time.Second)
				if tc.mod != nil {
					tc.mod(c)
				}
			})
			err := st.Upload(context.Background(), p, "flows/a.parquet")
			if err == nil {
				t.Fatal("upload succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.secret) {
				t.Fatalf("error %q: want it to name %q and not contain the secret", err, tc.want)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		output string
		bucket string
		prefix string
		bad    bool
	}{
		{"s3://b", "b", "", false},
		{"s3://b/p/q/", "b", "p/q", false},
		{"s3:///p", "", "", true},
		{"s3://b/p//q", "", "", true},
		{"/local", "", "", true},
	} {
		tg, err := s3out.ParseTarget(tc.output)
		if (err != nil) != tc.bad || (!tc.bad && (tg.Bucket != tc.bucket || tg.Prefix != tc.prefix)) {
			t.Errorf("ParseTarget(%q) = %+v, %v", tc.output, tg, err)
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(*s3out.Config)
		want string
	}{
		{"defaults", func(*s3out.Config) {}, ""},
		{"endpoint not a URL", func(c *s3out.Config) { c.Endpoint = "127.0.0.1:9000" }, "endpoint"},
		{"credentials in endpoint", func(c *s3out.Config) { c.Endpoint = "http://k:s@h:1" }, "endpoint"},
		{"tiny parts", func(c *s3out.Config) { c.PartSize = 1 << 20 }, "part_size"},
		{"missing credentials file", func(c *s3out.Config) { c.CredentialsFile = "/nonexistent/creds" }, "credentials_file"},
	} {
		c := s3out.DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want error about %q", tc.name, err, tc.want)
		}
	}
}

// flows returns n records of one agent batch in one hour.
func flows(seq int64, n int) []schemas.Flow {
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	v := make([]schemas.Flow, n)
	for i := range v {
		te := base.Add(time.Duration(i) * time.Millisecond).UnixMicro()
		v[i] = schemas.Flow{TimeStart: te - 5, TimeEnd: te, AgentID: "a", BatchSeq: seq, RecordIndex: int32(i), Bytes: int64(i), Packets: 1, TenantID: "t", Direction: "tx", Zone: "external"}
	}
	return v
}

// TestSinkToS3OutageThenBack: the Parquet sink with an S3 output acks only
// after the upload; with the gateway down it holds the acks and retries,
// and once the gateway is back everything is uploaded and acked, staging
// is empty, and the objects read back as the records.
func TestSinkToS3OutageThenBack(t *testing.T) {
	isolate(t)
	envCreds(t)
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "lake")
	st := store(t, srv, "s3://lake/tapflow", func(c *s3out.Config) { c.RequestTimeout = units.Duration(time.Second) })
	staging := t.TempDir()
	cfg := parquet.DefaultConfig()
	cfg.Output, cfg.StagingDir, cfg.Writer = "s3://lake/tapflow", staging, "c1"
	cfg.RollAge = units.Duration(time.Second)
	sink, err := parquet.New(cfg, parquet.Options{Node: "c1", Logger: quiet, Remote: st, Dedupe: true})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch)
	done := make(chan error, 1)
	go func() { done <- sink.Run(context.Background(), in) }()
	var mu sync.Mutex
	acked := map[int64]error{}
	send := func(seq int64) {
		b := pipeline.NewBatch(flows(seq, 500), func(err error) { mu.Lock(); acked[seq] = err; mu.Unlock() })
		b.Seq = seq
		in <- b
	}
	send(1)
	waitAck := func(seq int64, d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			mu.Lock()
			err, ok := acked[seq]
			mu.Unlock()
			if ok {
				if err != nil {
					t.Fatalf("batch %d acked with %v", seq, err)
				}
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}
	if !waitAck(1, 10*time.Second) {
		t.Fatal("batch 1 not acked after its roll")
	}
	srv.Stop() // S3 down
	send(2)
	if waitAck(2, 4*time.Second) {
		t.Fatal("batch 2 acked while S3 was down")
	}
	srv.Restart(t)
	if !waitAck(2, 40*time.Second) {
		t.Fatal("batch 2 not acked after S3 came back")
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	objs := srv.Objects(t, "lake", "tapflow/flows/")
	if len(objs) != 2 {
		t.Fatalf("objects %v, want 2", objs)
	}
	for k := range objs {
		if !strings.HasPrefix(k, "tapflow/flows/dt=2026-11-29/hour=10/c1-") {
			t.Fatalf("object %s not in the hive layout", k)
		}
		b := get(t, srv, "lake", k)
		rows, err := parquetRead(b)
		if err != nil || len(rows) != 500 {
			t.Fatalf("%s: %d rows, %v", k, len(rows), err)
		}
	}
	var left []string
	_ = filepath.WalkDir(staging, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("staging not cleaned: %v", left)
	}
}

// BenchmarkUpload: throughput of one 64 MiB object into versitygw on
// loopback (posix backend on the local disk), as one PUT and in parts.
func BenchmarkUpload(b *testing.B) {
	isolate(&testing.T{})
	srv := versitygw.Start(b, "")
	srv.MakeBucket(b, "bench")
	p := filepath.Join(b.TempDir(), "x.parquet")
	body := make([]byte, 64<<20)
	_, _ = rand.Read(body)
	if err := os.WriteFile(p, body, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, part := range []units.ByteSize{64 << 20, 16 << 20} {
		b.Run("part="+part.String(), func(b *testing.B) {
			cfg := s3out.DefaultConfig()
			cfg.Endpoint, cfg.PathStyle, cfg.Region, cfg.PartSize = srv.Endpoint, true, versitygw.Region, part
			cl := srv.Client()
			st, err := s3out.New("s3://bench/x", cfg, s3out.Options{Logger: quiet, Client: cl})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if err := st.Upload(context.Background(), p, "flows/o.parquet"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
