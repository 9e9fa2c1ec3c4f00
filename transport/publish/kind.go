package publish

import (
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// Kind describes one record type on the wire: where its batches go, how
// they are encoded, and what its metrics are called. One PublisherOf[T]
// serves every Kind, so the batch identity, max_payload splitting,
// retries and the spool exist once. The encoder writes each batch's
// identity columns (agent_id, batch_seq, record_index) from the batch:
// the records are not stamped.
type Kind[T any] struct {
	// Name is the sink name in pipeline metrics and logs.
	Name string
	// Component is the slog component and the prefix of errors.
	Component string
	// Stream is the JetStream stream a publish must land in.
	Stream string
	// Subject is the subject an agent on node publishes to.
	Subject func(node string) string
	// Table encodes the records (Arrow IPC).
	Table *schemas.Table[T]
	// SeqFile is the batch sequence reservation in the state directory.
	SeqFile string
	// MetricPrefix starts every metric name (e.g. tapflow_publish_).
	MetricPrefix string
	// Noun names a batch in metric help ("Batches", "Meter batches").
	Noun string
	// MaxBytesKey is the config key that sizes Stream (named in the fix
	// when the stream is full).
	MaxBytesKey string
}

// Flows is flow.v1 on TAPFLOW_FLOWS (tapflow.flows.v1.<node>).
var Flows = Kind[schemas.Flow]{
	Name: "publish", Component: "natspub",
	Stream: transport.FlowsStream, Subject: transport.FlowsSubject,
	Table:   schemas.FlowTable,
	SeqFile: "batch_seq", MetricPrefix: "tapflow_publish_", Noun: "Batches",
	MaxBytesKey: "nats.stream_max_bytes",
}

// Meters is meter.v1 on TAPFLOW_METERS (tapflow.meters.v1.<node>), with
// its own sequence file meter_seq.
var Meters = Kind[schemas.Meter]{
	Name: "publish-meters", Component: "natspub-meters",
	Stream: transport.MetersStream, Subject: transport.MetersSubject,
	Table:   schemas.MeterTable,
	SeqFile: "meter_seq", MetricPrefix: "tapflow_publish_meter_", Noun: "Meter batches",
	MaxBytesKey: "nats.meters_stream_max_bytes",
}
