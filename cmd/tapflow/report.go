package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tapflow/tapflow/internal/report"
)

func reportCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "", "directory holding flows/dt=…/hour=…/*.parquet (the collector output)")
	by := fs.String("by", strings.Join(report.DefaultBy, ","), "group by these dimensions, comma-separated, in this order: "+report.DimensionNames())
	fromS := fs.String("from", "", "keep records with time_end ≥ this time (RFC 3339, or YYYY-MM-DD[THH[:MM[:SS]]] in UTC)")
	toS := fs.String("to", "", "keep records with time_end < this time (same formats; exclusive)")
	tenant := fs.String("tenant", "", "keep only the records of this tenant_id (project ID)")
	zone := fs.String("zone", "", "keep only the records of this zone: "+strings.Join(report.Zones, ", "))
	format := fs.String("format", "table", "output format: table (aligned, human sizes and a TOTAL line), csv (header and exact integers) or json (docs/queries.md)")
	names := fs.String("names", "", "inventory file (docs/inventory.md) whose project, server, port and LB names are shown next to their IDs")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: tapflow report --data DIR [--by LIST] [--from T] [--to T] [--tenant ID] [--zone Z] [--format table|csv|json] [--names FILE]

Read the committed Parquet files under DIR/flows and print records, packets
and bytes per group (default: tenant × zone × direction), with totals.

Time range: records with --from ≤ time_end < --to (either may be left out).
Partitions (hours of time_end, UTC) outside the range are not read, and
rows inside the partitions at its edges are filtered one by one, so the
sums are exact to the microsecond. Times without a zone are UTC.

Examples:
  tapflow report --data /var/lib/tapflow --by tenant,zone,direction,external_network
  tapflow report --data /var/lib/tapflow --from 2026-11-01 --to 2026-12-01 --by tenant --format csv
  tapflow report --data /var/lib/tapflow --tenant 4f0c… --by server,port --names /etc/tapflow/inventory.yaml

Flags:
`)
		fs.PrintDefaults()
	}
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
	if *data == "" {
		return usageErr("--data is required (the collector output directory)")
	}
	opts := report.Options{Tenant: *tenant, Zone: *zone, Format: *format}
	var err error
	if opts.By, err = report.ParseBy(*by); err != nil {
		return usageErr("%v", err)
	}
	for _, t := range []struct {
		flag string
		s    string
		dst  *time.Time
	}{{"--from", *fromS, &opts.From}, {"--to", *toS, &opts.To}} {
		if t.s == "" {
			continue
		}
		if *t.dst, err = report.ParseTime(t.s); err != nil {
			return usageErr("%s %v", t.flag, err)
		}
	}
	if err := opts.Validate(); err != nil {
		return usageErr("%v", err)
	}
	if *names != "" {
		if opts.Names, err = report.LoadNames(*names); err != nil {
			return usageErr("--names: %v; give the static inventory file (docs/inventory.md)", err)
		}
	}
	start := time.Now()
	if err := report.Run(stdout, *data, opts); err != nil {
		fmt.Fprintf(stderr, "tapflow report: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintf(stderr, "report took %s\n", time.Since(start).Round(time.Millisecond))
	return exitOK
}
