package synthetic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// Options are the collaborators of the source.
type Options struct {
	// Node is the compute host name written into every record (required).
	Node string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry receives tapflow_synthetic_*; nil registers nothing.
	Registry prometheus.Registerer
	// Now is the clock of record timestamps (time_start, time_end);
	// default time.Now. A fixed clock makes records fully reproducible.
	// Pacing and batch age always follow real time.
	Now func() time.Time
	// RecycleArrays reuses an acked batch's record array for a later
	// batch (pipeline.Arrays), as the eBPF source does: the agent sets it.
	// Whoever reads a batch's records after acking it must leave it off.
	RecycleArrays bool
}

// Source is the synthetic cloud as a pipeline.Source.
type Source struct {
	cfg     Config
	node    string
	topo    *topology
	log     *slog.Logger
	now     func() time.Time
	records prometheus.Counter
	nacks   prometheus.Counter
	arrays  *pipeline.Arrays[schemas.Flow] // nil: a new array per batch
	// lastNackLog rate-limits the failure log (unix nanos): a full spool
	// fails every batch, the counter has them all.
	lastNackLog atomic.Int64
}

var _ pipeline.Source = (*Source)(nil)

// chunk bounds the records generated between two looks at the clock and
// the context.
const chunk = 1024

// New validates cfg and generates the cloud's inventory. It starts
// nothing; Run does.
func New(cfg Config, opts Options) (*Source, error) {
	if opts.Node == "" {
		return nil, errors.New("synthetic source: node name is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("synthetic source config: %w", err)
	}
	tp, err := buildTopology(cfg)
	if err != nil {
		return nil, fmt.Errorf("synthetic source: %w", err)
	}
	s := &Source{
		cfg: cfg, node: opts.Node, topo: tp, log: opts.Logger, now: opts.Now,
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_synthetic_records_total",
			Help: "Records the synthetic source handed to the pipeline.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_synthetic_batches_nacked_total",
			Help: "Synthetic batches that downstream stages acked with an error.",
		}),
	}
	if opts.RecycleArrays {
		s.arrays = pipeline.NewArrays[schemas.Flow](pipeline.FreeArrays)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("source", "synthetic")
	if s.now == nil {
		s.now = time.Now
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.records, s.nacks} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("synthetic source: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Name implements pipeline.Source.
func (s *Source) Name() string { return "synthetic" }

// Inventory is the generated cloud (inventory/synth with the
// config's sizes). Feed it to the enrich stage, e.g. with
// enrich.WithProvider(s.Provider()). Treat it as read-only.
func (s *Source) Inventory() *inventory.Inventory { return s.topo.inv }

// Provider returns a new provider that serves Inventory() once.
func (s *Source) Provider() *StaticProvider { return NewStaticProvider(s.topo.inv) }

// Run generates records until ctx is cancelled, then sends the batch it
// holds and returns nil. Batches are sent when they reach batch_records or
// when their first record is batch_max_age old; the send blocks on a full
// edge (backpressure), and a record rate limit does not catch up on time
// lost there. Every Run starts the same stream from the beginning; calls
// must not overlap. It never closes out.
func (s *Source) Run(ctx context.Context, out chan<- *pipeline.Batch) error {
	c := s.cfg
	g := newGenerator(c, s.topo, s.node, s.now().UnixMicro())
	maxAge := c.BatchMaxAge.D()
	var (
		recs  []schemas.Flow
		born  time.Time
		seq   int64
		sent  int64
		lim   *limiter
		timer *time.Timer
	)
	if c.RecordsPerSecond > 0 {
		lim = newLimiter(float64(c.RecordsPerSecond), time.Now())
	}
	flush := func() {
		if len(recs) == 0 {
			return
		}
		seq++
		ack := s.ack
		if s.arrays != nil {
			arr := recs
			ack = func(err error) {
				s.ack(err)
				s.arrays.Put(arr) // the ack ended the batch's life
			}
		}
		b := pipeline.NewBatch(recs, ack)
		b.Seq, b.Created = seq, born
		out <- b
		s.records.Add(float64(len(recs)))
		sent += int64(len(recs))
		recs = nil
	}
	s.log.Info("synthetic source started", "seed", c.Seed, "tenants", c.Tenants, "vms", len(s.topo.vms),
		"load_balancers", len(s.topo.lbs), "flows", c.FlowsPerSecond, "records_per_second", c.RecordsPerSecond,
		"batch_records", c.BatchRecords, "batch_max_age", maxAge, "attributed", c.Attributed)
	for {
		if ctx.Err() != nil {
			flush()
			if timer != nil {
				timer.Stop()
			}
			s.log.Info("synthetic source stopped", "records", sent, "batches", seq)
			return nil
		}
		want := min(chunk, c.BatchRecords-len(recs))
		n, now := want, time.Now()
		if lim != nil {
			n = lim.take(now, want)
		}
		if n > 0 {
			if recs == nil {
				recs, born = s.newArray(c.BatchRecords), now
			}
			recs = g.fill(recs, n, s.now().UnixMicro())
			if len(recs) == c.BatchRecords {
				flush()
				continue
			}
		}
		if recs != nil && now.Sub(born) >= maxAge {
			flush()
			continue
		}
		if n == want {
			continue
		}
		// rate-limited: sleep until a record is due or the batch is too old
		wait := lim.wait()
		if recs != nil {
			wait = min(wait, maxAge-now.Sub(born))
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
}

// newArray is an empty record array of capacity n: a recycled one when
// the source recycles (fill overwrites every record it appends).
func (s *Source) newArray(n int) []schemas.Flow {
	if s.arrays != nil {
		return s.arrays.Get(n)[:0]
	}
	return make([]schemas.Flow, 0, n)
}

func (s *Source) ack(err error) {
	if err != nil {
		s.nacks.Inc()
		now := time.Now().UnixNano()
		if last := s.lastNackLog.Load(); now-last > int64(10*time.Second) && s.lastNackLog.CompareAndSwap(last, now) {
			s.log.Warn("synthetic batches failing downstream (logged once per 10s; see tapflow_synthetic_batches_nacked_total)", "err", err)
		}
	}
}

// limiter is a token bucket of rate records/s holding at most 100 ms of
// records, so time lost to backpressure is not made up in a burst.
type limiter struct {
	rate, burst, tokens float64
	last                time.Time
}

func newLimiter(rate float64, now time.Time) *limiter {
	return &limiter{rate: rate, burst: max(1, rate/10), last: now}
}

// take returns how many of want records may be generated now.
func (l *limiter) take(now time.Time, want int) int {
	if d := now.Sub(l.last); d > 0 {
		l.tokens = min(l.burst, l.tokens+d.Seconds()*l.rate)
		l.last = now
	}
	n := min(want, int(l.tokens))
	l.tokens -= float64(n)
	return n
}

// wait is how long until the next record is due (at least 1 ms).
func (l *limiter) wait() time.Duration {
	return max(time.Millisecond, time.Duration((1-l.tokens)/l.rate*float64(time.Second)))
}
