// Package report reads the committed flow.v1 Parquet files under a data
// directory (<data>/flows/dt=YYYY-MM-DD/hour=HH/*.parquet, as written by
// package sinks/parquet) and prints a usage table per tenant × zone ×
// direction: records, packets and bytes, with a totals row, followed by the
// file count, row count, bytes on disk and the partitions read. It is what
// `tapflow report --data DIR` prints.
//
// Files are read with parquet-go one row group at a time, projecting only
// the five columns the table needs; temp files (dot-prefixed, .tmp) are
// never read.
package report
