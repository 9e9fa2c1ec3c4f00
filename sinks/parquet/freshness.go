package parquet

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Freshness: how long after a record's time_end (the flow's end) it is
// committed (a local file renamed into place) and uploaded (the object
// stored, with an s3:// output). The sink notes the time_end of every
// record it writes, to the second, and observes them all when the roll
// commits (and uploads); records of a failed roll are forgotten, they
// are observed when their redelivery commits.

// Stages of tapflow_parquet_freshness_seconds.
const (
	StageCommitted = "committed"
	StageUploaded  = "uploaded"
)

// FreshnessBuckets are the upper bounds of the freshness histogram:
// seconds (size rolls at high rates) to an hour (late records, spool
// replays).
var FreshnessBuckets = []float64{1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 75, 90, 120, 150, 180, 240, 300, 330, 360, 420, 480, 600, 900, 1200, 1800, 2700, 3600}

// ends counts the records written since the last roll by time_end second.
type ends struct {
	n       map[int64]uint64
	last    int64 // run-length cache: records of a batch mostly end in the same second
	lastN   uint64
	started bool
}

func (e *ends) note(us int64) {
	sec := us / 1e6
	if e.started && sec == e.last {
		e.lastN++
		return
	}
	e.flush()
	e.last, e.lastN, e.started = sec, 1, true
}

func (e *ends) flush() {
	if e.started && e.lastN > 0 {
		if e.n == nil {
			e.n = map[int64]uint64{}
		}
		e.n[e.last] += e.lastN
	}
	e.lastN = 0
}

// take returns the counts and starts over.
func (e *ends) take() map[int64]uint64 {
	e.flush()
	m := e.n
	e.n, e.started = nil, false
	return m
}

func (e *ends) reset() { e.n, e.started, e.lastN = nil, false, 0 }

// freshness is a histogram by stage that observes many records of one
// value at once (client_golang's Histogram observes one at a time: a
// roll holds millions).
type freshness struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	st   map[string]*weighted
}

type weighted struct {
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	count  uint64
}

func newFreshness(schema string) *freshness {
	f := &freshness{
		desc: prometheus.NewDesc("tapflow_parquet_freshness_seconds",
			"Time from a record's time_end (flow end) to its file's commit (stage committed) and, with an s3:// output, to its upload (stage uploaded), as seen by this collector's clock.",
			[]string{"stage"}, prometheus.Labels{"schema": schema}),
		st: map[string]*weighted{},
	}
	for _, s := range []string{StageCommitted, StageUploaded} {
		f.st[s] = &weighted{counts: make([]uint64, len(FreshnessBuckets)+1)}
	}
	return f
}

// observe adds every record of counts (time_end second → records) as
// seen at now. A time_end ahead of now (agent clock ahead) counts as 0.
func (f *freshness) observe(stage string, now time.Time, counts map[int64]uint64) {
	if len(counts) == 0 {
		return
	}
	nowSec := float64(now.UnixNano()) / 1e9
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.st[stage]
	for sec, n := range counts {
		// time_end is truncated to the second: +0.5 s is its mean.
		d := math.Max(0, nowSec-(float64(sec)+0.5))
		w.counts[sort.SearchFloat64s(FreshnessBuckets, d)] += n
		w.sum += d * float64(n)
		w.count += n
	}
}

func (f *freshness) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f *freshness) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for stage, w := range f.st {
		b := make(map[float64]uint64, len(FreshnessBuckets))
		var cum uint64
		for i, ub := range FreshnessBuckets {
			cum += w.counts[i]
			b[ub] = cum
		}
		ch <- prometheus.MustNewConstHistogram(f.desc, w.count, w.sum, b, stage)
	}
}

// freshnessQuantile estimates the q-quantile of a stage from the
// buckets, as Prometheus's histogram_quantile does (linear within a
// bucket); NaN with no observation.
func (s *Sink[T]) freshnessQuantile(stage string, q float64) float64 {
	f := s.fresh
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.st[stage]
	if w == nil || w.count == 0 {
		return math.NaN()
	}
	rank := q * float64(w.count)
	var cum uint64
	lo := 0.0
	for i, ub := range FreshnessBuckets {
		c := w.counts[i]
		if float64(cum+c) >= rank && c > 0 {
			return lo + (ub-lo)*(rank-float64(cum))/float64(c)
		}
		cum += c
		lo = ub
	}
	return FreshnessBuckets[len(FreshnessBuckets)-1]
}
