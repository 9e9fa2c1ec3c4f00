// Package schemas defines the flow.v1 record and everything derived from its
// column table (package columns): the Go struct [Flow] (generated), the Arrow
// schema, the Parquet schema, and the NATS wire format (one Arrow IPC stream
// per batch, see [Encoder] and [Decoder]).
//
// Regenerate flow_gen.go after changing the column table: `make generate`.
package schemas

//go:generate go run ./internal/schemagen flow_gen.go
