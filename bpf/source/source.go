//go:build linux

package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	Registry *prometheus.Registry
	// Meters, when set, receives every meter.v1 delta (per tap and
	// direction, each meter_interval and once at shutdown). It may block.
	Meters func(ctx context.Context, ms []capture.MeterRecord) error
}

// Source is the eBPF capture as a pipeline.Source.
type Source struct {
	cap    *capture.Capture
	dec    *Decoder
	meters func(ctx context.Context, ms []capture.MeterRecord) error
	log    *slog.Logger
	nacks  prometheus.Counter
	out    chan<- *pipeline.Batch
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
	c, err := capture.New(cfg, capture.Options{Logger: log, Registry: opts.Registry, Handler: s})
	if err != nil {
		return nil, fmt.Errorf("ebpf source: %w", err)
	}
	s.cap = c
	return s, nil
}

// Name implements pipeline.Source.
func (s *Source) Name() string { return "ebpf" }

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
// Run returns, so the shutdown flush is never dropped.
func (s *Source) Flows(_ context.Context, recs []capture.Record) error {
	flows := make([]schemas.Flow, len(recs))
	for i := range recs {
		s.dec.Decode(&recs[i], &flows[i])
	}
	s.out <- pipeline.NewBatch(flows, s.ack)
	return nil
}

func (s *Source) ack(err error) {
	if err != nil {
		s.nacks.Inc()
		s.log.Warn("captured batch failed downstream", "err", err)
	}
}

// Meters implements capture.Handler.
func (s *Source) Meters(ctx context.Context, ms []capture.MeterRecord) error {
	if s.meters == nil {
		return nil
	}
	return s.meters(ctx, ms)
}
