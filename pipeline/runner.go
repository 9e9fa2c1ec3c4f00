package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tapflow/tapflow/schemas"
)

// Config shapes a Runner.
type Config struct {
	// Name labels the metrics and logs ("agent", "collector").
	Name string
	// EdgeCapacity is the number of batches each edge buffers (default 16).
	EdgeCapacity int
	// ShutdownTimeout bounds the drain after the source stops; then the
	// sink's context is cancelled (default 30s).
	ShutdownTimeout time.Duration
}

// Runner supervises a flow pipeline.
type Runner = RunnerOf[schemas.Flow]

// RunnerOf supervises one source → transforms → sink chain of batches of T.
type RunnerOf[T any] struct {
	cfg        Config
	source     SourceOf[T]
	transforms []TransformOf[T]
	sink       SinkOf[T]
	metrics    *Metrics
	log        *slog.Logger

	pendingMu sync.Mutex
	pending   map[*BatchOf[T]]struct{} // handed to the sink, not yet acked
}

// NewRunner validates a flow chain; it starts nothing.
func NewRunner(cfg Config, src Source, transforms []Transform, sink Sink, m *Metrics, log *slog.Logger) (*Runner, error) {
	return NewRunnerOf(cfg, src, transforms, sink, m, log)
}

// NewRunnerOf validates a chain of any record type; it starts nothing.
// Pipelines of one process share m: their series differ by cfg.Name.
func NewRunnerOf[T any](cfg Config, src SourceOf[T], transforms []TransformOf[T], sink SinkOf[T], m *Metrics, log *slog.Logger) (*RunnerOf[T], error) {
	if src == nil || sink == nil {
		return nil, errors.New("pipeline: a source and a sink are required")
	}
	if cfg.Name == "" {
		return nil, errors.New("pipeline: a name is required")
	}
	if cfg.EdgeCapacity <= 0 {
		cfg.EdgeCapacity = 16
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	if log == nil {
		log = slog.Default()
	}
	// Error and discard series exist at 0 from start, so rate() and
	// increase() alerts see the first one.
	m.Errors.WithLabelValues(cfg.Name, src.Name())
	for _, t := range transforms {
		m.Errors.WithLabelValues(cfg.Name, t.Name())
		m.Discarded.WithLabelValues(cfg.Name, t.Name(), "filtered")
	}
	m.Errors.WithLabelValues(cfg.Name, sink.Name())
	return &RunnerOf[T]{cfg: cfg, source: src, transforms: transforms, sink: sink, metrics: m,
		log: log.With("pipeline", cfg.Name), pending: make(map[*BatchOf[T]]struct{})}, nil
}

// Run runs every stage until ctx is cancelled and the chain has drained,
// or until a stage fails. It returns the first stage error.
func (r *RunnerOf[T]) Run(ctx context.Context) error {
	// hardCtx is cancelled on a stage failure or when the drain times out.
	hardCtx, hardCancel := context.WithCancel(context.Background())
	defer hardCancel()
	g, gctx := errgroup.WithContext(hardCtx)

	// The source stops on ctx (soft stop) or on any failure.
	srcCtx, srcCancel := context.WithCancel(gctx)
	defer srcCancel()
	go func() {
		select {
		case <-ctx.Done():
			srcCancel()
			select {
			case <-time.After(r.cfg.ShutdownTimeout):
				r.log.Error("drain timed out; cancelling the sink", "timeout", r.cfg.ShutdownTimeout)
				hardCancel()
			case <-hardCtx.Done():
			}
		case <-hardCtx.Done():
		}
	}()

	name := r.cfg.Name
	edge := make(chan *BatchOf[T], r.cfg.EdgeCapacity)
	r.watchQueue(hardCtx, edge, r.firstConsumer())
	src := r.source
	first := edge
	g.Go(func() error {
		defer close(first)
		if err := src.Run(srcCtx, first); err != nil {
			r.metrics.Errors.WithLabelValues(name, src.Name()).Inc()
			return fmt.Errorf("source %s: %w", src.Name(), err)
		}
		return nil
	})

	in := edge
	for i, t := range r.transforms {
		out := make(chan *BatchOf[T], r.cfg.EdgeCapacity)
		next := r.sink.Name()
		if i+1 < len(r.transforms) {
			next = r.transforms[i+1].Name()
		}
		r.watchQueue(hardCtx, out, next)
		tin := in
		g.Go(func() error { return r.runTransform(gctx, t, tin, out) })
		in = out
	}

	sinkIn := make(chan *BatchOf[T], r.cfg.EdgeCapacity)
	last := in
	g.Go(func() error { r.countSinkInput(gctx, last, sinkIn); return nil })
	g.Go(func() error {
		if err := r.sink.Run(gctx, sinkIn); err != nil {
			r.metrics.Errors.WithLabelValues(name, r.sink.Name()).Inc()
			return fmt.Errorf("sink %s: %w", r.sink.Name(), err)
		}
		return nil
	})
	// Monitors live until every stage has returned.
	monCtx, monCancel := context.WithCancel(context.Background())
	go r.watchOldest(monCtx)
	err := g.Wait()
	monCancel()
	hardCancel()
	return err
}

func (r *RunnerOf[T]) firstConsumer() string {
	if len(r.transforms) > 0 {
		return r.transforms[0].Name()
	}
	return r.sink.Name()
}

func (r *RunnerOf[T]) runTransform(ctx context.Context, t TransformOf[T], in <-chan *BatchOf[T], out chan<- *BatchOf[T]) error {
	defer close(out)
	name := r.cfg.Name
	for b := range in {
		n := len(b.Records)
		r.metrics.Received.WithLabelValues(name, t.Name()).Add(float64(n))
		if err := t.Apply(ctx, b); err != nil {
			r.metrics.Errors.WithLabelValues(name, t.Name()).Inc()
			r.log.Warn("transform failed a batch", "stage", t.Name(), "seq", b.Seq, "records", n, "err", err)
			b.Ack(fmt.Errorf("transform %s: %w", t.Name(), err))
			continue
		}
		if _, holds := t.(HolderOf[T]); !holds && n > len(b.Records) {
			d := n - len(b.Records)
			r.metrics.Discarded.WithLabelValues(name, t.Name(), "filtered").Add(float64(d))
		}
		r.metrics.Sent.WithLabelValues(name, t.Name()).Add(float64(len(b.Records)))
		select {
		case out <- b:
		case <-ctx.Done():
			b.Ack(fmt.Errorf("transform %s: %w", t.Name(), context.Cause(ctx)))
			// keep draining so upstream never blocks on a dead edge
			for b := range in {
				b.Ack(fmt.Errorf("transform %s: %w", t.Name(), context.Cause(ctx)))
			}
			return nil
		}
	}
	if h, ok := t.(HolderOf[T]); ok {
		if held := h.Flush(); len(held) > 0 {
			r.log.Info("flushing records held by a transform", "stage", t.Name(), "records", len(held))
			r.metrics.Sent.WithLabelValues(name, t.Name()).Add(float64(len(held)))
			out <- NewBatchOf(held, nil)
		}
	}
	return nil
}

// countSinkInput forwards batches to the sink, counting what it receives
// and hooking each ack to count what it made durable.
func (r *RunnerOf[T]) countSinkInput(ctx context.Context, in <-chan *BatchOf[T], out chan<- *BatchOf[T]) {
	defer close(out)
	name, stage := r.cfg.Name, r.sink.Name()
	recv := r.metrics.Received.WithLabelValues(name, stage)
	sent := r.metrics.Sent.WithLabelValues(name, stage)
	errs := r.metrics.Errors.WithLabelValues(name, stage)
	for b := range in {
		recv.Add(float64(len(b.Records)))
		r.pendingMu.Lock()
		r.pending[b] = struct{}{}
		r.pendingMu.Unlock()
		b.wrapAck(func(n int, err error) {
			r.pendingMu.Lock()
			delete(r.pending, b)
			r.pendingMu.Unlock()
			if err != nil {
				errs.Inc()
				return
			}
			sent.Add(float64(n))
		})
		select {
		case out <- b:
		case <-ctx.Done():
			// The sink is gone (failure or hard stop): fail what is left so
			// producers see the error and nothing upstream blocks forever.
			b.Ack(fmt.Errorf("sink %s: %w", stage, context.Cause(ctx)))
			for b := range in {
				b.Ack(fmt.Errorf("sink %s: %w", stage, context.Cause(ctx)))
			}
			return
		}
	}
}

func (r *RunnerOf[T]) watchQueue(ctx context.Context, ch chan *BatchOf[T], stage string) {
	g := r.metrics.Queue.WithLabelValues(r.cfg.Name, stage)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			g.Set(float64(len(ch)))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

func (r *RunnerOf[T]) watchOldest(ctx context.Context) {
	g := r.metrics.Oldest.WithLabelValues(r.cfg.Name, r.sink.Name())
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var oldest time.Time
		r.pendingMu.Lock()
		for b := range r.pending {
			if oldest.IsZero() || b.Created.Before(oldest) {
				oldest = b.Created
			}
		}
		r.pendingMu.Unlock()
		if oldest.IsZero() {
			g.Set(0)
		} else {
			g.Set(time.Since(oldest).Seconds())
		}
	}
}
