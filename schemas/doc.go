// Package schemas defines tapflow's records and everything derived from
// their column tables (package columns): the Go structs [Flow] (flow.v1)
// and [Meter] (meter.v1), generated; the Arrow schema, the Parquet schema
// and the NATS wire format (one Arrow IPC stream per batch) of each,
// through a [Table] ([FlowTable], [MeterTable]) and [EncoderOf] /
// [DecoderOf]. [Encoder], [Decoder], [ToArrow], [FromArrow], [ArrowSchema]
// and [ParquetSchema] are the flow.v1 shorthands.
//
// Regenerate flow_gen.go, meter_gen.go and docs/schema.md after changing
// a column table: `make generate`. [BodyCodec] and the Tapflow-* headers
// (package transport) complete the subscriber contract
// (docs/subscribers.md).
package schemas

//go:generate go run ./internal/schemagen .
