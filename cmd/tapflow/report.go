package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tapflow/tapflow/internal/report"
)

const reportUsage = `Usage: tapflow report --data DIR|s3://bucket/prefix [--by LIST] [--from T] [--to T] [--tenant ID] [--zone Z] [--format table|csv|json] [--names FILE] [--meters]

Read the committed Parquet files under DIR/flows (or s3://bucket/prefix/flows)
and print records, packets and bytes per group (default: tenant × zone ×
direction), with totals. day and hour group by time_end (UTC): the basis of
a bill is --by day,tenant or --by hour,tenant,direction.

With --meters, read meter.v1 instead (the kernel's own per-tap counts, with
what it lost), grouped by node, ifname, direction, day and hour (default
node,ifname,direction).

Time range: records with --from ≤ time_end < --to (either may be left out).
Partitions (hours of time_end, UTC) outside the range are not read, and
rows inside the partitions at its edges are filtered one by one, so the
sums are exact to the microsecond. Times without a zone are UTC.

Examples:
  tapflow report --data /var/lib/tapflow --by tenant,zone,direction,external_network
  tapflow report --data /var/lib/tapflow --from 2026-11-01 --to 2026-12-01 --by day,tenant --format csv
  tapflow report --data s3://billing-lake/tapflow --config /etc/tapflow/tapflow.yaml --by hour,tenant
  tapflow report --data /var/lib/tapflow --tenant 4f0c… --by server,port --names /etc/tapflow/inventory.yaml
  tapflow report --data /var/lib/tapflow --meters --by day,node

Flags:
`

// reportCmd implements `tapflow report` (internal/report).
func reportCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var d dataFlags
	d.register(fs)
	by := fs.String("by", "", "group by these dimensions, comma-separated, in this order: "+report.DimensionNames()+" (default "+strings.Join(report.DefaultBy, ",")+"; with --meters: "+strings.Join(report.MeterDimensions, ", ")+", default "+strings.Join(report.DefaultMeterBy, ",")+")")
	fromS := fs.String("from", "", "keep records with time_end ≥ this time (RFC 3339, or YYYY-MM-DD[THH[:MM[:SS]]] in UTC)")
	toS := fs.String("to", "", "keep records with time_end < this time (same formats; exclusive)")
	tenant := fs.String("tenant", "", "keep only the records of this tenant_id (project ID)")
	zone := fs.String("zone", "", "keep only the records of this zone: "+strings.Join(report.Zones, ", "))
	format := fs.String("format", "table", "output format: table (aligned, human sizes and a TOTAL line), csv (header and exact integers) or json (docs/queries.md)")
	names := fs.String("names", "", "inventory file (docs/inventory.md) whose project, server, port and LB names are shown next to their IDs")
	meters := fs.Bool("meters", false, "report meter.v1 (kernel counts and loss per node, tap, direction) instead of flows")
	fs.Usage = func() { fmt.Fprint(stderr, reportUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tapflow report: "+format+"\n", a...)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q; flags only (see tapflow report --help)", fs.Arg(0))
	}
	if d.data == "" {
		return usageErr("--data is required (the collector output directory or s3://bucket/prefix)")
	}
	var from, to time.Time
	var err error
	for _, t := range []struct {
		flag string
		s    string
		dst  *time.Time
	}{{"--from", *fromS, &from}, {"--to", *toS, &to}} {
		if t.s == "" {
			continue
		}
		if *t.dst, err = report.ParseTime(t.s); err != nil {
			return usageErr("%s %v", t.flag, err)
		}
	}
	ctx := context.Background()
	start := time.Now()
	if *meters {
		mo := report.MeterOptions{From: from, To: to, Format: *format}
		if *by != "" {
			if mo.By, err = report.ParseMeterBy(*by); err != nil {
				return usageErr("%v", err)
			}
		}
		if *tenant != "" || *zone != "" || *names != "" {
			return usageErr("--tenant, --zone and --names apply to flows; meters have no tenant (drop them, or drop --meters)")
		}
		check := report.Options{From: from, To: to, Format: *format}
		if err := check.Validate(); err != nil {
			return usageErr("%v", err)
		}
		out, err := d.open(ctx)
		if err != nil {
			return usageErr("%v", err)
		}
		rep, err := report.ReadMeters(ctx, out, mo)
		if err == nil {
			err = rep.Write(stdout, *format)
		}
		if err != nil {
			fmt.Fprintf(stderr, "tapflow report: %v\n", err)
			return exitRuntime
		}
		fmt.Fprintf(stderr, "report took %s\n", time.Since(start).Round(time.Millisecond))
		return exitOK
	}
	opts := report.Options{Tenant: *tenant, Zone: *zone, Format: *format, From: from, To: to}
	if opts.By, err = report.ParseBy(*cmpOr(by, strings.Join(report.DefaultBy, ","))); err != nil {
		return usageErr("%v", err)
	}
	if err := opts.Validate(); err != nil {
		return usageErr("%v", err)
	}
	if *names != "" {
		if opts.Names, err = report.LoadNames(*names); err != nil {
			return usageErr("--names: %v; give the static inventory file (docs/inventory.md)", err)
		}
	}
	out, err := d.open(ctx)
	if err != nil {
		return usageErr("%v", err)
	}
	if err := report.RunOutput(ctx, stdout, out, opts); err != nil {
		fmt.Fprintf(stderr, "tapflow report: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintf(stderr, "report took %s\n", time.Since(start).Round(time.Millisecond))
	return exitOK
}

func cmpOr(s *string, def string) *string {
	if *s == "" {
		return &def
	}
	return s
}
