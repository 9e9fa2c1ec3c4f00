package pipeline

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/schemas"
)

func TestBatchAckExactlyOnce(t *testing.T) {
	var calls atomic.Int32
	var got error
	b := NewBatch(make([]schemas.Flow, 3), func(err error) { calls.Add(1); got = err })
	want := errors.New("boom")
	b.Ack(want)
	if calls.Load() != 1 || got != want || !b.Acked() {
		t.Fatalf("ack calls=%d err=%v", calls.Load(), got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("second Ack did not panic")
		}
	}()
	b.Ack(nil)
}

func TestAckGroup(t *testing.T) {
	var g AckGroup
	var acked atomic.Int32
	for range 5 {
		g.Add(NewBatch(make([]schemas.Flow, 2), func(err error) {
			if err == nil {
				acked.Add(1)
			}
		}))
	}
	if b, r := g.Len(); b != 5 || r != 10 {
		t.Fatalf("Len = %d, %d; want 5, 10", b, r)
	}
	g.Ack(nil)
	g.Ack(nil) // empty now: must not double-ack
	if acked.Load() != 5 {
		t.Fatalf("acked %d, want 5", acked.Load())
	}
}

// countSource emits batches of size until ctx ends, then one last partial
// batch (what a real source holds at shutdown).
type countSource struct {
	size     int
	produced atomic.Int64
	acked    atomic.Int64
	failed   atomic.Int64
	limit    int64 // stop producing after this many records (0: unlimited)
}

func (s *countSource) Name() string { return "count" }
func (s *countSource) Run(ctx context.Context, out chan<- *Batch) error {
	emit := func(n int) {
		s.produced.Add(int64(n))
		out <- NewBatch(make([]schemas.Flow, n), func(err error) {
			if err != nil {
				s.failed.Add(int64(n))
				return
			}
			s.acked.Add(int64(n))
		})
	}
	for ctx.Err() == nil {
		if s.limit > 0 && s.produced.Load() >= s.limit {
			<-ctx.Done()
			break
		}
		emit(s.size)
	}
	emit(s.size / 2) // the partial batch held at shutdown must not be lost
	return nil
}

// bufferSink holds batches and acks them only on close (like the Parquet
// sink commits a file), or with an error if ctx is cancelled first.
type bufferSink struct {
	delay time.Duration
	fail  error
	got   atomic.Int64
}

func (s *bufferSink) Name() string { return "buffer" }
func (s *bufferSink) Run(ctx context.Context, in <-chan *Batch) error {
	var g AckGroup
	for {
		select {
		case b, ok := <-in:
			if !ok {
				g.Ack(nil)
				return nil
			}
			if s.fail != nil {
				b.Ack(s.fail)
				return s.fail
			}
			time.Sleep(s.delay)
			s.got.Add(int64(len(b.Records)))
			g.Add(b)
		case <-ctx.Done():
			g.Ack(ctx.Err())
			for b := range in {
				b.Ack(ctx.Err())
			}
			return nil
		}
	}
}

func TestRunnerDrainsOnShutdown(t *testing.T) {
	cases := []struct {
		name       string
		transforms []Transform
		capacity   int
	}{
		{"no transforms", nil, 1},
		{"two transforms", []Transform{
			TransformFunc{"stamp", func(_ context.Context, b *Batch) error { b.Seq = 1; return nil }},
			TransformFunc{"check", func(_ context.Context, b *Batch) error { return nil }},
		}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := &countSource{size: 100}
			sink := &bufferSink{delay: time.Millisecond}
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			r, err := NewRunner(Config{Name: "test", EdgeCapacity: tc.capacity}, src, tc.transforms, sink, m, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			if err := r.Run(ctx); err != nil {
				t.Fatal(err)
			}
			p, a := src.produced.Load(), src.acked.Load()
			if p == 0 || a != p || src.failed.Load() != 0 || sink.got.Load() != p {
				t.Fatalf("produced %d, sink got %d, acked %d, failed %d", p, sink.got.Load(), a, src.failed.Load())
			}
			if got := testutil.ToFloat64(m.Sent.WithLabelValues("test", "buffer")); int64(got) != p {
				t.Fatalf("sink sent metric %v, want %d", got, p)
			}
		})
	}
}

func TestRunnerTransformErrorAcksBatch(t *testing.T) {
	src := &countSource{size: 10, limit: 100}
	sink := &bufferSink{}
	var n atomic.Int32
	bad := TransformFunc{"flaky", func(_ context.Context, b *Batch) error {
		if n.Add(1)%2 == 0 {
			return errors.New("bad batch")
		}
		return nil
	}}
	m := NewMetrics(nil)
	r, _ := NewRunner(Config{Name: "t"}, src, []Transform{bad}, sink, m, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if src.acked.Load()+src.failed.Load() != src.produced.Load() || src.failed.Load() == 0 {
		t.Fatalf("produced %d acked %d failed %d", src.produced.Load(), src.acked.Load(), src.failed.Load())
	}
	if testutil.ToFloat64(m.Errors.WithLabelValues("t", "flaky")) == 0 {
		t.Fatal("transform errors not counted")
	}
}

func TestRunnerSinkFailureStopsPipeline(t *testing.T) {
	src := &countSource{size: 10}
	boom := errors.New("disk on fire")
	r, _ := NewRunner(Config{Name: "t"}, src, nil, &bufferSink{fail: boom}, nil, nil)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("Run = %v, want %v", err, boom)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pipeline kept running after the sink failed")
	}
}

// stuckSink never finishes on its own: only the hard stop ends it.
type stuckSink struct{ once sync.Once }

func (s *stuckSink) Name() string { return "stuck" }
func (s *stuckSink) Run(ctx context.Context, in <-chan *Batch) error {
	for {
		select {
		case b, ok := <-in:
			if !ok {
				<-ctx.Done() // pretend a commit hangs
				return nil
			}
			b.Ack(nil)
		case <-ctx.Done():
			for b := range in {
				b.Ack(ctx.Err())
			}
			return nil
		}
	}
}

func TestRunnerHardStopAfterTimeout(t *testing.T) {
	r, _ := NewRunner(Config{Name: "t", ShutdownTimeout: 50 * time.Millisecond}, &countSource{size: 1}, nil, &stuckSink{}, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ShutdownTimeout")
	}
}

func TestNewRunnerValidates(t *testing.T) {
	if _, err := NewRunner(Config{Name: "x"}, nil, nil, &bufferSink{}, nil, nil); err == nil {
		t.Fatal("nil source accepted")
	}
	if _, err := NewRunner(Config{}, &countSource{}, nil, &bufferSink{}, nil, nil); err == nil {
		t.Fatal("empty name accepted")
	}
}

// holdingTransform keeps every third batch's records until Flush.
type holdingTransform struct {
	n    int
	held []schemas.Flow
}

func (h *holdingTransform) Name() string { return "hold" }
func (h *holdingTransform) Apply(_ context.Context, b *Batch) error {
	h.n++
	if h.n%3 == 0 {
		h.held = append(h.held, b.Records...)
		b.Records = b.Records[:0]
	}
	return nil
}
func (h *holdingTransform) Flush() []schemas.Flow { held := h.held; h.held = nil; return held }

func TestRunnerFlushesHolders(t *testing.T) {
	src := &countSource{size: 10, limit: 95}
	sink := &bufferSink{}
	r, _ := NewRunner(Config{Name: "t"}, src, []Transform{&holdingTransform{}}, sink, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if sink.got.Load() != src.produced.Load() {
		t.Fatalf("sink got %d records, source produced %d", sink.got.Load(), src.produced.Load())
	}
}
