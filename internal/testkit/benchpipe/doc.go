// Package benchpipe holds the end-to-end pipeline benchmarks of `make
// bench`: synthetic records → Arrow IPC → embedded NATS JetStream →
// Parquet in one process, against a naive JSON-lines writer as baseline,
// reporting records per wall second, records per CPU second and bytes per
// record on disk. It has no non-test code.
package benchpipe
