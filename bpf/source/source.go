//go:build linux

package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// Options are the collaborators of the source.
type Options struct {
	// Node is the compute host name written into every record (required).
	Node string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry receives the tapflow_capture_* metrics; nil registers none.
	Registry prometheus.Registerer
	// Meters, when set, receives every meter.v1 delta (per tap and
	// direction, each meter_interval and once at shutdown). It may block;
	// done is called once the deltas are durable (MeterFeed.Add).
	Meters func(ctx context.Context, ms []capture.MeterRecord, done func()) error
	// Detach: at stop, export the whole kernel table and remove the pinned
	// capture state (capture.Options.Detach).
	Detach bool
}

// Source is the eBPF capture as a pipeline.Source.
type Source struct {
	cap    *capture.Capture
	dec    *Decoder
	meters func(ctx context.Context, ms []capture.MeterRecord, done func()) error
	log    *slog.Logger
	nacks  prometheus.Counter
	out    chan<- *pipeline.Batch
	arrays *pipeline.Arrays[schemas.Flow] // record arrays of acked batches
	// emitted counts the batches sent into out (ExportLive reports it).
	emitted atomic.Uint64
}

// New validates the config and options. It loads and attaches nothing;
// Run does.
func New(cfg capture.Config, opts Options) (*Source, error) {
	if opts.Node == "" {
		return nil, errors.New("ebpf source: node name is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Source{
		dec:    NewDecoder(opts.Node),
		arrays: pipeline.NewArrays[schemas.Flow](pipeline.FreeArrays),
		meters: opts.Meters,
		log:    log.With("source", "ebpf"),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_capture_batches_nacked_total",
			Help: "Batches of captured records that downstream stages acked with an error.",
		}),
	}
	if opts.Registry != nil {
		if err := opts.Registry.Register(s.nacks); err != nil {
			return nil, fmt.Errorf("ebpf source: register metrics: %w", err)
		}
	}
	c, err := capture.New(cfg, capture.Options{Logger: log, Registry: opts.Registry, Handler: s, Detach: opts.Detach})
	if err != nil {
		return nil, fmt.Errorf("ebpf source: %w", err)
	}
	s.cap = c
	return s, nil
}

// PinNote is capture.PinNote: why the pin will not outlive the agent, or "".
func (s *Source) PinNote() string { return s.cap.PinNote() }

// Name implements pipeline.Source.
func (s *Source) Name() string { return "ebpf" }

// Running reports whether the capture is loaded and attached (readiness).
func (s *Source) Running() bool { return s.cap.Running() }

// Run captures until ctx is done, then flushes every flow still in the
// kernel (end_reason shutdown) into out and returns. It never closes out.
func (s *Source) Run(ctx context.Context, out chan<- *pipeline.Batch) error {
	s.out = out
	if err := s.cap.Run(ctx); err != nil {
		return fmt.Errorf("ebpf source: %w", err)
	}
	return nil
}

// Flows implements capture.Handler: one batch per call. The send blocks on
// a full edge (backpressure) and, by the pipeline contract, is read until
// Run returns, so the shutdown flush is never dropped. The batch's ack
// (published, or in the spool) is the capture's done: only then does the
// capture give the records' ring-buffer space back.
func (s *Source) Flows(_ context.Context, recs []capture.Record, done func()) error {
	flows := s.arrays.Get(len(recs))
	for i := range recs {
		flows[i] = schemas.Flow{} // a recycled array holds the last batch's records
		s.dec.Decode(&recs[i], &flows[i])
	}
	s.out <- pipeline.NewBatch(flows, func(err error) {
		if err != nil {
			// Counted as lost downstream (spool full, …): retrying
			// from the ring would block the capture behind it.
			s.nacks.Inc()
			s.log.Warn("captured batch failed downstream", "err", err)
		}
		done()
		s.arrays.Put(flows) // the ack ended the batch's life
	})
	s.emitted.Add(1)
	return nil
}

// ExportLive exports every flow still in the kernel (capture.ExportLive,
// end_reason inventory_change) into out and returns how many batches the
// source had sent into out by the end of that export, counted from its
// start: once the stage after the source has taken that many batches, it
// has seen every record of traffic that crossed a tap before the export
// (enrich's swap barrier, enrich.WithExporter).
func (s *Source) ExportLive(ctx context.Context) (batches uint64, err error) {
	if err := s.cap.ExportLive(ctx); err != nil {
		return 0, fmt.Errorf("ebpf source: %w", err)
	}
	return s.emitted.Load(), nil
}

// Close implements the lifecycle shape; the capture releases its kernel
// handles when Run returns and never detaches a pinned capture here.
func (s *Source) Close() error { return s.cap.Close() }

// Meters implements capture.Handler.
func (s *Source) Meters(ctx context.Context, ms []capture.MeterRecord, done func()) error {
	if s.meters == nil {
		done()
		return nil
	}
	return s.meters(ctx, ms, done)
}
