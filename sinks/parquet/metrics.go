package parquet

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	files, bytes, rows, commitErrors prometheus.Counter
	dupRecords, dupPieces            prometheus.Counter
	uploadRetries                    prometheus.Counter
	rejected                         prometheus.Counter
	open                             prometheus.Gauge
	commitSeconds                    prometheus.Histogram
	fresh                            *freshness
}

func newMetrics(schema string) *metrics {
	l := prometheus.Labels{"schema": schema}
	return &metrics{
		fresh: newFreshness(schema),
		files: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_files_committed_total", ConstLabels: l, Help: "Parquet files committed (renamed into place and fsynced).",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_bytes_committed_total", ConstLabels: l, Help: "Bytes of committed Parquet files.",
		}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_rows_committed_total", ConstLabels: l, Help: "Rows in committed Parquet files.",
		}),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_commit_errors_total", ConstLabels: l, Help: "Failed writes or commits; each failed every batch held and removed every open file.",
		}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tapflow_parquet_open_files", ConstLabels: l, Help: "Parquet files being written (one per open partition).",
		}),
		dupRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_duplicate_records_total", ConstLabels: l, Help: "Records of redelivered batches not written again because a committed (or open) file already holds them.",
		}),
		dupPieces: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_duplicate_batches_total", ConstLabels: l, Help: "Agent batch pieces (one batch's records of one hour) dropped as already committed.",
		}),
		uploadRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_upload_retries_total", ConstLabels: l, Help: "Failed uploads of committed files to the object store (retried; acks wait).",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tapflow_parquet_rejected_batches_total", ConstLabels: l, Help: "Batches refused without writing any record: a time_end outside the partitions the sink creates (see MinTimeEnd, MaxTimeEnd).",
		}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "tapflow_parquet_commit_seconds",
			ConstLabels: l,
			Help:        "Time to commit every open file of a roll: close, fsync, rename, fsync directories.",
			Buckets:     []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.files, m.bytes, m.rows, m.commitErrors, m.open, m.commitSeconds, m.dupRecords, m.dupPieces, m.uploadRetries, m.rejected, m.fresh}
}
