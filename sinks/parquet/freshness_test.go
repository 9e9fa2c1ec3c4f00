package parquet

import (
	"context"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
)

// slowRemote stores nothing and takes delay per upload.
type slowRemote struct {
	delay   time.Duration
	uploads atomic.Int64
}

func (r *slowRemote) List(string) ([]string, error)          { return nil, nil }
func (r *slowRemote) Batches(string, string) (string, error) { return "", nil }
func (r *slowRemote) String() string                         { return "s3://slow" }
func (r *slowRemote) Upload(ctx context.Context, _, _ string) error {
	r.uploads.Add(1)
	select {
	case <-time.After(r.delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestFreshness (issue 22 item 6): in a synctest bubble (exact time),
// records ending 10 s before they reach the sink are committed by the
// age roll 5 min later: the committed stage observes each of them once at
// 310 s (time_end's second, +0.5 s: 309.5 s), the uploaded stage 7 s
// later with a remote whose upload takes 7 s; a hard stop observes
// nothing (those records are observed when their redelivery commits).
func TestFreshness(t *testing.T) {
	for _, tc := range []struct {
		name         string
		remote       bool
		hardStop     bool
		committed    float64 // mean, 0: no observation
		uploaded     float64
		wantUploaded bool
	}{
		{name: "local", committed: 309.5},
		{name: "remote", remote: true, committed: 309.5, uploaded: 316.5},
		{name: "hard stop", hardStop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The bubble's clock starts at 2000-01-01 00:00 UTC, the
				// first partition the sink accepts: step past it.
				time.Sleep(time.Hour)
				cfg := testConfig(t)
				cfg.Compression = CompressionNone // no zstd pools inside the bubble (TestAgeRoll)
				opts := Options{Node: "node-a", Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()}
				if tc.remote {
					cfg.StagingDir, cfg.Output = cfg.Output, "s3://bucket/prefix"
					opts.Remote = &slowRemote{delay: 7 * time.Second}
				}
				s, err := New(cfg, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				end := time.Now().Add(-10 * time.Second)
				recs := parquettest.Flows(parquettest.Spec{Records: 1000, Start: end, Span: time.Nanosecond})
				for i := range recs {
					recs[i].TimeEnd = end.UnixMicro()
				}
				a := newAcks()
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				r := start(ctx, s)
				r.send(a.batches(recs, 100, 1)...)
				if tc.hardStop {
					cancel()
					close(r.in)
					<-r.done
				} else {
					time.Sleep(6 * time.Minute)
					synctest.Wait()
					r.close(t)
				}
				for stage, mean := range map[string]float64{StageCommitted: tc.committed, StageUploaded: tc.uploaded} {
					w := s.fresh.st[stage]
					want := uint64(0)
					if mean > 0 {
						want = uint64(len(recs))
					}
					if w.count != want {
						t.Fatalf("%s: %d observations, want %d", stage, w.count, want)
					}
					if want > 0 && math.Abs(w.sum/float64(w.count)-mean) > 1e-6 {
						t.Errorf("%s: mean %.3f s, want %.1f", stage, w.sum/float64(w.count), mean)
					}
					if q := s.freshnessQuantile(stage, 0.99); want > 0 && (q < 300 || q > 330) {
						t.Errorf("%s: p99 %.1f, want in its bucket (300, 330]", stage, q)
					}
				}
			})
		})
	}
}

// TestCommitDue: the sink asks CommitDue after each batch it holds and
// commits the open files when it names a reason, long before roll_age.
func TestCommitDue(t *testing.T) {
	cfg := testConfig(t)
	var asked atomic.Int64
	due := func() string {
		if asked.Add(1)%3 == 0 {
			return "test"
		}
		return ""
	}
	s, err := New(cfg, Options{Node: "node-a", Logger: slog.New(slog.DiscardHandler), CommitDue: due})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs := parquettest.Flows(parquettest.Spec{Records: 1000, Start: time.Date(2026, 11, 29, 10, 5, 0, 0, time.UTC), Span: 10 * time.Minute})
	a := newAcks()
	r := start(t.Context(), s)
	r.send(a.batches(recs, 100, 1)...)
	r.sync(t)
	if ok, failed := a.state(); ok != 9 || failed != 0 {
		t.Fatalf("before close: %d acked, %d failed; want 9 acked by three early commits (roll_age %s)", ok, failed, cfg.RollAge)
	}
	if got := readOutput(t, cfg.Output, "node-a"); len(got.files) != 3 || len(got.rows) != 900 {
		t.Fatalf("early commits left %d files with %d rows; want 3 with 900", len(got.files), len(got.rows))
	}
	r.close(t)
	if got := readOutput(t, cfg.Output, "node-a"); len(got.files) != 4 || len(got.rows) != 1000 {
		t.Fatalf("%d files, %d rows; want 4, 1000", len(got.files), len(got.rows))
	}
	if n := asked.Load(); n != 10 {
		t.Errorf("CommitDue asked %d times for 10 batches", n)
	}
}
