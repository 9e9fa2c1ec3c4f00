package consume

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/schemas"
)

// release gives the decoded buffers of a row source's message back to its
// pool once nothing reads its rows: a message the source does not hand
// downstream (dead-lettered, counted). The sink releases the others.
func release[T any](recs []T) {
	if rows, ok := any(recs).([]schemas.Row); ok {
		schemas.ReleaseRows(rows)
	}
}

// poolMetrics reads the decode pool's counters (they exist at 0 from the
// start, like every other series of the source).
func poolMetrics(p *schemas.BufferPool, l prometheus.Labels) []prometheus.Collector {
	stat := func(f func(schemas.PoolStats) float64) func() float64 {
		return func() float64 { return f(p.Stats()) }
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tapflow_consume_decode_pool_idle_bytes", ConstLabels: l,
			Help: "Idle decode buffers kept for the next messages (at most the pool's cap)."},
			stat(func(s schemas.PoolStats) float64 { return float64(s.Idle) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tapflow_consume_decode_pool_held_bytes", ConstLabels: l,
			Help: "Decode buffers of messages whose rows are not released yet (queued for or being written by the sink)."},
			stat(func(s schemas.PoolStats) float64 { return float64(s.Out) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tapflow_consume_decode_pool_gets_total", ConstLabels: l,
			Help: "Decode buffers handed out by the pool."},
			stat(func(s schemas.PoolStats) float64 { return float64(s.Gets) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tapflow_consume_decode_pool_hits_total", ConstLabels: l,
			Help: "Decode buffers handed out that were recycled, not allocated."},
			stat(func(s schemas.PoolStats) float64 { return float64(s.Hits) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tapflow_consume_decode_pool_dropped_total", ConstLabels: l,
			Help: "Released decode buffers not kept because the pool held its cap of idle buffers (left to the garbage collector)."},
			stat(func(s schemas.PoolStats) float64 { return float64(s.Dropped) })),
	}
}
