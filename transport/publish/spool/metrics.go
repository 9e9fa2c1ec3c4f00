package spool

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the spool's Prometheus series.
type Metrics struct {
	Bytes prometheus.Gauge
	// MaxBytes is agent.spool.max_bytes, so "near full" is one ratio.
	MaxBytes prometheus.Gauge
	Entries  prometheus.Gauge
	// OldestAge is the age of the batch at the head of the spool (0 when
	// empty): how far behind replay is. Set by the replayer.
	OldestAge     prometheus.Gauge
	Appended      prometheus.Counter
	AppendedBytes prometheus.Counter
	Replayed      prometheus.Counter
	// Dropped counts batches lost because the spool could not take them,
	// by reason: full, write_error, too_large, corrupt.
	Dropped        *prometheus.CounterVec
	DroppedRecords *prometheus.CounterVec
	TornTails      prometheus.Counter
	CorruptBytes   prometheus.Counter
	WriteErrors    prometheus.Counter
}

// dropReasons are the Dropped reasons; each series exists at 0 from start
// so rate() alerts work before the first loss.
var dropReasons = []string{"full", "write_error", "too_large", "corrupt"}

func newMetrics() *Metrics {
	m := &Metrics{
		Bytes:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_spool_bytes", Help: "Bytes of spool segments on disk (bounded by agent.spool.max_bytes)."}),
		MaxBytes:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_spool_max_bytes", Help: "agent.spool.max_bytes: the most the spool holds; beyond it batches are dropped (reason full)."}),
		Entries:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_spool_entries", Help: "Batches in the spool waiting to be replayed."}),
		OldestAge:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_spool_oldest_age_seconds", Help: "Age of the oldest spooled batch (0 when the spool is empty)."}),
		Appended:       prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_spool_appended_batches_total", Help: "Batches written to the spool because NATS was unreachable or slow."}),
		AppendedBytes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_spool_appended_bytes_total", Help: "Bytes written to the spool."}),
		Replayed:       prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_spool_replayed_batches_total", Help: "Spooled batches published and acknowledged by JetStream."}),
		Dropped:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_spool_dropped_batches_total", Help: "Batches lost at the spool, by reason (full, write_error, too_large, corrupt)."}, []string{"reason"}),
		DroppedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_spool_dropped_records_total", Help: "Flow records lost at the spool, by reason."}, []string{"reason"}),
		TornTails:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_spool_torn_tails_total", Help: "Torn last writes truncated at start-up (an append cut by a crash)."}),
		CorruptBytes:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_spool_corrupt_bytes_total", Help: "Spool bytes skipped because they held no valid frame."}),
		WriteErrors:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_spool_write_errors_total", Help: "Failed spool writes or fsyncs (e.g. disk full)."}),
	}
	for _, r := range dropReasons {
		m.Dropped.WithLabelValues(r)
		m.DroppedRecords.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Bytes, m.MaxBytes, m.Entries, m.OldestAge, m.Appended, m.AppendedBytes, m.Replayed, m.Dropped, m.DroppedRecords, m.TornTails, m.CorruptBytes, m.WriteErrors}
}

func (m *Metrics) register(r prometheus.Registerer) error {
	for i, c := range m.collectors() {
		if err := r.Register(c); err != nil {
			for _, d := range m.collectors()[:i] {
				r.Unregister(d)
			}
			return err
		}
	}
	return nil
}
