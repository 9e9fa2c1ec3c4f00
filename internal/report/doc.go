// Package report reads the committed flow.v1 Parquet files under a data
// directory (<data>/flows/dt=YYYY-MM-DD/hour=HH/*.parquet, as written by
// package sinks/parquet) and sums records, packets and bytes per group of
// any of tenant, zone, direction, external_network, server, port, lb,
// lb_segment, lb_tap, pool, member, node, ifname, day and hour (default
// tenant × zone × direction), over a time range [From, To) of time_end,
// optionally for one tenant or zone. It prints a table (with a totals
// line, the files and partitions read), CSV or JSON. It is what `tapflow
// report` runs.
//
// Files are read with parquet-go one row group at a time, projecting only
// the columns the report needs and decoding them straight from the page
// buffers (dictionary indexes, int64 arrays). The range prunes partitions
// by their hour, then row groups by their time_end statistics, then rows
// one by one, so the totals are exact. Temp files (dot-prefixed, .tmp) are
// never read.
//
// lb counts every byte once: a member's copy of segment 2 (lb_tap member)
// reads as lb ” (Dimension.BlankColumn), so a load balancer's rows hold
// what its amphora's taps saw and every grouping has the same total.
package report
