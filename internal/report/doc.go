// Package report reads the committed flow.v1 Parquet files under a data
// directory (<data>/flows/dt=YYYY-MM-DD/hour=HH/*.parquet, as written by
// package sinks/parquet) and sums records, packets and bytes per group of
// any of tenant, zone, direction, external_network, server, port, lb,
// lb_segment, node and ifname (default tenant × zone × direction), over a
// time range [From, To) of time_end, optionally for one tenant or zone. It
// prints a table (with a totals line, the files and partitions read), CSV
// or JSON. It is what `tapflow report` runs.
//
// Files are read with parquet-go one row group at a time, projecting only
// the columns the report needs and decoding them straight from the page
// buffers (dictionary indexes, int64 arrays). The range prunes partitions
// by their hour, then row groups by their time_end statistics, then rows
// one by one, so the totals are exact. Temp files (dot-prefixed, .tmp) are
// never read.
package report
