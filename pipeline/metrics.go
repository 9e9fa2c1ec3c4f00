package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the standard per-stage series of every pipeline. Label values
// are stage and edge names only (bounded).
type Metrics struct {
	Received  *prometheus.CounterVec // records a stage took in
	Sent      *prometheus.CounterVec // records a stage passed on (sink: made durable)
	Discarded *prometheus.CounterVec // records a stage dropped on purpose, by reason
	Errors    *prometheus.CounterVec // failed batches/operations, by stage
	Queue     *prometheus.GaugeVec   // batches waiting on an edge
	Oldest    *prometheus.GaugeVec   // age of the oldest batch the sink has not acked
}

// NewMetrics registers the pipeline metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tapflow_stage_received_records_total", Help: "Records taken in by a pipeline stage.",
		}, []string{"pipeline", "stage"}),
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tapflow_stage_sent_records_total", Help: "Records passed on by a stage; for sinks, records made durable (acked).",
		}, []string{"pipeline", "stage"}),
		Discarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tapflow_stage_discarded_records_total", Help: "Records dropped by a stage, by reason.",
		}, []string{"pipeline", "stage", "reason"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tapflow_stage_errors_total", Help: "Failed batches or operations, by stage.",
		}, []string{"pipeline", "stage"}),
		Queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tapflow_edge_queue_batches", Help: "Batches waiting on the edge into a stage.",
		}, []string{"pipeline", "stage"}),
		Oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tapflow_stage_oldest_pending_seconds", Help: "Age of the oldest batch handed to the sink and not yet acked.",
		}, []string{"pipeline", "stage"}),
	}
	if reg != nil {
		reg.MustRegister(m.Received, m.Sent, m.Discarded, m.Errors, m.Queue, m.Oldest)
	}
	return m
}
