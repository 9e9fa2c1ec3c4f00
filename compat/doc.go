// Package compat is tapflow's compatibility module: a separate Go module
// (so the tapflow binary never links DuckDB) whose tests read the
// collector's Parquet output with DuckDB (github.com/duckdb/duckdb-go/v2,
// cgo, the prebuilt static libduckdb of duckdb-go-bindings) exactly as a
// billing user would: read_parquet('<root>/flows/**/*.parquet',
// hive_partitioning=true). They assert exact rows and types (TIMESTAMP
// WITH TIME ZONE, BIGINT counters, VARCHAR strings), partition columns,
// the schema key-value metadata, and run every query of docs/queries.md.
//
// Run with `make compat-test` (or `cd compat && go test ./...`).
package compat
