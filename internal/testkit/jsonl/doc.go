// Package jsonl is the naive JSON-lines sink: every flow.v1 record is
// encoded with encoding/json as one line of a single file. It exists as the
// baseline the Parquet sink (package sinks/parquet) is benchmarked against
// (BenchmarkJSONLinesSink); it does not partition, roll or bound memory, and
// is not meant for production.
package jsonl
