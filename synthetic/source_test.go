package synthetic

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func TestNew(t *testing.T) {
	bad := DefaultConfig()
	bad.Tenants = 0
	reg := prometheus.NewRegistry()
	if _, err := New(DefaultConfig(), Options{Node: "a", Registry: reg}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		opts Options
		want string
	}{
		{"no node", DefaultConfig(), Options{}, "node name is required"},
		{"bad config", bad, Options{Node: "a"}, "tenants: 0 is out of range"},
		{"metrics registered twice", DefaultConfig(), Options{Node: "a", Registry: reg}, "register metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	var fe *units.FieldError
	if _, err := New(bad, Options{Node: "a"}); !errors.As(err, &fe) || fe.Path != "tenants" {
		t.Errorf("config error %v does not carry the field", err)
	}
}

func TestStaticProvider(t *testing.T) {
	s := newSource(t, DefaultConfig(), Options{})
	p := s.Provider()
	inv, changed, err := p.Poll(context.Background())
	if err != nil || !changed || inv != s.Inventory() {
		t.Fatalf("first poll: %p %v %v", inv, changed, err)
	}
	if inv, changed, err := p.Poll(context.Background()); err != nil || changed || inv != nil {
		t.Fatalf("second poll: %p %v %v", inv, changed, err)
	}
}

// bubbleRun runs s inside a synctest bubble for d of fake time, with a
// consumer that acks every batch, then cancels; it returns the batches and
// the time each arrived.
func bubbleRun(t *testing.T, s *Source, d time.Duration) (batches []*pipeline.Batch, at []time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *pipeline.Batch, 4)
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		errc <- s.Run(ctx, out)
		close(out)
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := range out {
			batches = append(batches, b)
			at = append(at, time.Since(start))
			b.Ack(nil)
		}
	}()
	time.Sleep(d)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	<-done
	return batches, at
}

func total(bs []*pipeline.Batch) int {
	n := 0
	for _, b := range bs {
		n += len(b.Records)
	}
	return n
}

// TestRateLimit: over d of (fake) time the source emits rate × d records,
// to within 1 % and the 100 ms burst the bucket may hold.
func TestRateLimit(t *testing.T) {
	for _, tc := range []struct {
		rate int
		d    time.Duration
	}{
		{50, 20 * time.Second},
		{1000, 10 * time.Second},
		{40000, 3 * time.Second},
		{400000, time.Second},
	} {
		t.Run(fmt.Sprintf("%d per s", tc.rate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := DefaultConfig()
				c.RecordsPerSecond, c.FlowsPerSecond = tc.rate, min(tc.rate, 1000)
				reg := prometheus.NewRegistry()
				bs, _ := bubbleRun(t, newSource(t, c, Options{Registry: reg}), tc.d)
				got, want := float64(total(bs)), float64(tc.rate)*tc.d.Seconds()
				if got < want*0.99-1 || got > want*1.01+float64(tc.rate)/10 {
					t.Errorf("%v records in %v at %d/s, want %v", got, tc.d, tc.rate, want)
				}
				if m := counterValue(t, reg, "tapflow_synthetic_records_total"); m != got {
					t.Errorf("tapflow_synthetic_records_total = %v, want %v", m, got)
				}
			})
		})
	}
}

// TestBatchAge: at 1000 records/s with batches of 16384 and max age 1s,
// the source sends about 1000 records a second; shutdown sends the rest.
func TestBatchAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := DefaultConfig()
		c.RecordsPerSecond, c.FlowsPerSecond = 1000, 100
		bs, at := bubbleRun(t, newSource(t, c, Options{}), 5500*time.Millisecond)
		if len(bs) != 6 {
			t.Fatalf("%d batches at %v, want 5 by age and 1 at shutdown", len(bs), at)
		}
		for i, b := range bs[:5] {
			if n := len(b.Records); n < 990 || n > 1010 || at[i] < time.Duration(i+1)*time.Second || at[i] > time.Duration(i+1)*time.Second+10*time.Millisecond {
				t.Errorf("batch %d: %d records at %v, want ~1000 at %ds", i, n, at[i], i+1)
			}
		}
		if n := len(bs[5].Records); n < 490 || n > 510 || at[5] != 5500*time.Millisecond {
			t.Errorf("shutdown batch: %d records at %v, want ~500 at 5.5s", n, at[5])
		}
	})
}

// TestShutdownSendsPartialBatch: cancelling Run sends what it holds, even
// when the consumer is slow (the send blocks: backpressure), and returns
// nil without closing out.
func TestShutdownSendsPartialBatch(t *testing.T) {
	t.Run("rate-limited, batch not full", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := DefaultConfig()
			c.RecordsPerSecond, c.FlowsPerSecond, c.BatchMaxAge = 1000, 100, units.Duration(time.Hour)
			bs, at := bubbleRun(t, newSource(t, c, Options{}), 2500*time.Millisecond)
			if len(bs) != 1 || at[0] != 2500*time.Millisecond {
				t.Fatalf("%d batches at %v, want one at shutdown", len(bs), at)
			}
			if n := len(bs[0].Records); n < 2490 || n > 2510 {
				t.Errorf("shutdown batch has %d records, want ~2500", n)
			}
		})
	})
	t.Run("unlimited, slow consumer", func(t *testing.T) {
		c := fastConfig()
		c.BatchRecords = 1000
		reg := prometheus.NewRegistry()
		s := newSource(t, c, Options{Registry: reg})
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan *pipeline.Batch) // unbuffered: every send waits for us
		errc := make(chan error, 1)
		go func() { errc <- s.Run(ctx, out) }()
		var got int
		var acked atomic.Int64
		for range 3 {
			b := <-out
			got += len(b.Records)
			b.Ack(nil)
			acked.Add(1)
		}
		cancel()
		time.Sleep(10 * time.Millisecond) // Run is blocked sending a batch
		for {
			select {
			case b := <-out:
				got += len(b.Records)
				b.Ack(nil)
				continue
			case err := <-errc:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
			break
		}
		close(out) // panics if the source closed it
		if m := counterValue(t, reg, "tapflow_synthetic_records_total"); float64(got) != m || got < 3000 {
			t.Fatalf("received %d records, source counted %v", got, m)
		}
	})
}

// TestNackCounted: a batch acked with an error is counted and logged.
func TestNackCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newSource(t, fastConfig(), Options{Registry: reg})
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *pipeline.Batch, 1)
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx, out); close(out) }()
	(<-out).Ack(errors.New("disk full"))
	cancel()
	for b := range out {
		b.Ack(nil)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(s.nacks); v != 1 {
		t.Fatalf("nacks = %v, want 1", v)
	}
}

// TestRecycleArrays: with RecycleArrays (as the agent runs it) an acked
// batch's array carries a later batch, and without it every batch has
// its own; TestDeterminism checks the records are the same either way.
func TestRecycleArrays(t *testing.T) {
	for _, recycle := range []bool{false, true} {
		t.Run(fmt.Sprint("recycle=", recycle), func(t *testing.T) {
			_, batches := runFor(t, newSource(t, fastConfig(), Options{Now: fixedClock, RecycleArrays: recycle}), 20*4096)
			seen := map[*schemas.Flow]bool{}
			reused := 0
			for _, b := range batches {
				p := &b.Records[:1][0]
				if seen[p] {
					reused++
				}
				seen[p] = true
			}
			if recycle && reused < len(batches)/2 {
				t.Fatalf("%d of %d batches on a recycled array, want most", reused, len(batches))
			}
			if !recycle && reused != 0 {
				t.Fatalf("%d of %d batches on a recycled array without RecycleArrays", reused, len(batches))
			}
		})
	}
}
