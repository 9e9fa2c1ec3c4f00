package s3out_test

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
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

// cutProxy forwards TCP to target. Once trip bytes have gone towards the
// server it cuts every connection and refuses new ones (an outage in the
// middle of an upload) until heal is called.
type cutProxy struct {
	ln      net.Listener
	target  string
	trip    int64
	sent    atomic.Int64
	mu      sync.Mutex
	down    bool
	tripped chan struct{}
	conns   map[net.Conn]struct{}
}

func startCutProxy(t *testing.T, target string, trip int64) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, trip: trip, tripped: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *cutProxy) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		c.Close()
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c], p.conns[s] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(c, s); c.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if p.sent.Add(int64(n)) > p.trip && p.trip > 0 {
				p.mu.Lock()
				first := !p.down
				p.down, p.trip = true, 0
				p.mu.Unlock()
				if first {
					close(p.tripped)
				}
				p.cut()
				return
			}
			if _, err := s.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	s.Close()
}

// cut closes every open connection.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *cutProxy) heal() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// incomplete lists the incomplete multipart uploads of bucket, straight
// from the gateway (not through the proxy).
func incomplete(t *testing.T, srv *versitygw.Server, bucket string) []string {
	t.Helper()
	out, err := srv.Client().ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatalf("list multipart uploads of %s: %v", bucket, err)
	}
	var keys []string
	for _, u := range out.Uploads {
		keys = append(keys, aws.ToString(u.Key))
	}
	return keys
}

// randomFlows are records that barely compress (so a few of them make a
// file larger than one 5 MiB part).
func randomFlows(seq int64, n int, rnd *rand.Rand) []schemas.Flow {
	ip := func() string {
		var a [4]byte
		for i := range a {
			a[i] = byte(rnd.Uint32())
		}
		return netip.AddrFrom4(a).String()
	}
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	v := make([]schemas.Flow, n)
	for i := range v {
		te := base.Add(time.Duration(i) * time.Millisecond).UnixMicro()
		v[i] = schemas.Flow{TimeStart: te - rnd.Int64N(1e6), TimeEnd: te, AgentID: "a", BatchSeq: seq, RecordIndex: int32(i), Bytes: rnd.Int64N(1 << 40),
			Packets: rnd.Int64N(1 << 30), TenantID: "t", Direction: "tx", Zone: "external", SrcIP: ip(), DstIP: ip(),
			SrcPort: rnd.Int32N(65536), DstPort: rnd.Int32N(65536), Protocol: 6}
	}
	return v
}

// TestMultipartOutageLeavesNoIncompleteUpload: S3 goes away in the middle
// of a multipart upload (a proxy cuts every connection after the first
// part and refuses new ones), so the abort of the failed upload fails too
// and an incomplete upload stays in the bucket. Once S3 answers again
// the sink's retry stores the file and the leftover is aborted — within
// the same run, or, when the collector was stopped during the outage, by
// the next start. Afterwards ListMultipartUploads is empty and every
// record is in the bucket once.
func TestMultipartOutageLeavesNoIncompleteUpload(t *testing.T) {
	isolate(t)
	envCreds(t)
	for _, tc := range []struct {
		name    string
		restart bool // stop the sink during the outage, start a new one after
	}{
		{"outage then back", false},
		{"stopped during the outage, next start cleans", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := versitygw.Start(t, "")
			srv.MakeBucket(t, "lake")
			// Another writer's incomplete upload under the same prefix is
			// not this collector's to abort.
			other := "tapflow/flows/dt=2026-11-29/hour=10/c10-00000000000000000001-00000000000000000001.parquet"
			if _, err := srv.Client().CreateMultipartUpload(context.Background(), &s3.CreateMultipartUploadInput{Bucket: aws.String("lake"), Key: aws.String(other)}); err != nil {
				t.Fatal(err)
			}
			addr := strings.TrimPrefix(srv.Endpoint, "http://")
			proxy := startCutProxy(t, addr, 5<<20+512<<10) // into the second 5 MiB part
			reg := prometheus.NewRegistry()
			newStore := func(r prometheus.Registerer) *s3out.Store {
				cfg := s3out.DefaultConfig()
				cfg.Endpoint, cfg.PathStyle, cfg.Region = proxy.endpoint(), true, versitygw.Region
				cfg.PartSize = 5 << 20
				cfg.RequestTimeout = units.Duration(2 * time.Second)
				cfg.MaxBackoff = units.Duration(500 * time.Millisecond)
				st, err := s3out.New("s3://lake/tapflow", cfg, s3out.Options{Logger: quiet, Registry: r})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			st := newStore(reg)
			staging := t.TempDir()
			pcfg := parquet.DefaultConfig()
			pcfg.Output, pcfg.StagingDir, pcfg.Writer = "s3://lake/tapflow", staging, "c1"
			run := func(st *s3out.Store, batches []*pipeline.Batch) (context.CancelFunc, <-chan error) {
				sink, err := parquet.New(pcfg, parquet.Options{Node: "c1", Logger: quiet, Remote: st, Dedupe: true})
				if err != nil {
					t.Fatal(err)
				}
				in := make(chan *pipeline.Batch, len(batches))
				for _, b := range batches {
					in <- b
				}
				close(in) // one roll, one file, uploaded before Run returns
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- sink.Run(ctx, in) }()
				return cancel, done
			}

			// 24 batches of 10000 records that barely compress: one file
			// of two parts.
			rnd := rand.New(rand.NewPCG(3, 4))
			const batches, per = 24, 10000
			var mu sync.Mutex
			acked := map[int64]error{}
			var all []*pipeline.Batch
			for seq := int64(1); seq <= batches; seq++ {
				b := pipeline.NewBatch(randomFlows(seq, per, rnd), func(err error) { mu.Lock(); acked[seq] = err; mu.Unlock() })
				b.Seq = seq
				all = append(all, b)
			}
			cancel, done := run(st, all)
			defer cancel()
			select {
			case <-proxy.tripped:
			case err := <-done:
				t.Fatalf("sink returned (%v) before S3 went away: the file is smaller than a part?", err)
			case <-time.After(60 * time.Second):
				t.Fatal("no upload went past the first part in 60 s")
			}
			// The outage lasts long enough for the abort to fail too.
			deadline := time.Now().Add(10 * time.Second)
			for metric(t, reg, "tapflow_s3_incomplete_uploads") == 0 {
				if time.Now().After(deadline) {
					t.Fatal("tapflow_s3_incomplete_uploads still 0 10 s into the outage: the failed upload's abort did not fail, the outage is not mid-upload")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if left := incomplete(t, srv, "lake"); len(left) != 2 {
				t.Fatalf("during the outage: incomplete uploads %v, want ours and the other writer's", left)
			}
			if tc.restart {
				// A hard stop while S3 is away: the file stays staged, the
				// batches are failed for redelivery; the next start
				// uploads the staged file (the ledger then finds the
				// batches committed).
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				proxy.heal()
				reg = prometheus.NewRegistry()
				cancel, done = run(newStore(reg), nil)
				defer cancel()
			} else {
				proxy.heal()
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the sink did not finish its upload 60 s after S3 came back")
			}
			if left := incomplete(t, srv, "lake"); len(left) != 1 || left[0] != other {
				t.Fatalf("after the outage: incomplete uploads %v, want only the other writer's %s", left, other)
			}
			seen := map[[2]int64]bool{}
			for k := range srv.Objects(t, "lake", "tapflow/flows/") {
				r, _ := parquetRead(srv.Get(t, "lake", k))
				for _, f := range r {
					id := [2]int64{f.BatchSeq, int64(f.RecordIndex)}
					if seen[id] {
						t.Fatalf("record %v twice", id)
					}
					seen[id] = true
				}
			}
			if len(seen) != batches*per {
				t.Fatalf("%d records in the bucket, want %d", len(seen), batches*per)
			}
			if !tc.restart {
				mu.Lock()
				for seq := int64(1); seq <= batches; seq++ {
					if err, ok := acked[seq]; !ok || err != nil {
						t.Errorf("batch %d: acked %v, err %v", seq, ok, err)
					}
				}
				mu.Unlock()
			}
			if v := metric(t, reg, "tapflow_s3_incomplete_uploads"); v != 0 {
				t.Errorf("tapflow_s3_incomplete_uploads %v after recovery, want 0", v)
			}
			if v := metric(t, reg, "tapflow_s3_multipart_aborted_total"); v < 1 {
				t.Errorf("tapflow_s3_multipart_aborted_total %v, want ≥ 1", v)
			}
		})
	}
}

// metric reads a registered counter or gauge.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}
