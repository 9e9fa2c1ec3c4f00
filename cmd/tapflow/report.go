package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/report"
)

func init() { register(newReportCmd) }

func newReportCmd() *cobra.Command {
	var (
		d                                    dataFlags
		by, fromS, toS, tenant, zone, format string
		names                                string
		meters                               bool
	)
	cmd := &cobra.Command{
		Use:   "report --data DIR|s3://bucket/prefix [flags]",
		Short: "bytes and packets by tenant, zone, server, LB, day, hour… over a time range (table, CSV, JSON)",
		Long: `Read the committed Parquet files under DIR/flows (or s3://bucket/prefix/flows)
and print records, packets and bytes per group (default: tenant × zone ×
direction), with totals. day and hour group by time_end (UTC): the basis of
a bill is --by day,tenant or --by hour,tenant,direction.

lb counts every byte once: a load balancer's rows hold what its amphora's
taps saw (segment 1, segment 2, lb_tap amphora); a member's copy of segment
2 (lb_tap member, the same bytes seen again at the member VM's tap) is under
lb '' with the member's other traffic. --by lb_tap shows both sides.

With --meters, read meter.v1 instead (the kernel's own per-tap counts, with
what it lost), grouped by node, ifname, direction, day and hour (default
node,ifname,direction).

Time range: records with --from ≤ time_end < --to (either may be left out).
Partitions (hours of time_end, UTC) outside the range are not read, and
rows inside the partitions at its edges are filtered one by one, so the
sums are exact to the microsecond. Times without a zone are UTC.`,
		Example: `  tapflow report --data /var/lib/tapflow --by tenant,zone,direction,external_network
  tapflow report --data /var/lib/tapflow --from 2026-11-01 --to 2026-12-01 --by day,tenant --format csv
  tapflow report --data s3://billing-lake/tapflow --config /etc/tapflow/tapflow.yaml --by hour,tenant
  tapflow report --data /var/lib/tapflow --tenant 4f0c… --by server,port --names /etc/tapflow/inventory.yaml
  tapflow report --data /var/lib/tapflow --meters --by day,node`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if d.data == "" {
				return usageHint("--data is required (the collector output directory or s3://bucket/prefix)")
			}
			var from, to time.Time
			var err error
			for _, t := range []struct {
				flag string
				s    string
				dst  *time.Time
			}{{"--from", fromS, &from}, {"--to", toS, &to}} {
				if t.s == "" {
					continue
				}
				if *t.dst, err = report.ParseTime(t.s); err != nil {
					return usageErr("%s %v", t.flag, err)
				}
			}
			ctx := context.Background()
			start := time.Now()
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			if meters {
				mo := report.MeterOptions{From: from, To: to, Format: format}
				if by != "" {
					if mo.By, err = report.ParseMeterBy(by); err != nil {
						return usageErr("%v", err)
					}
				}
				if tenant != "" || zone != "" || names != "" {
					return usageErr("--tenant, --zone and --names apply to flows; meters have no tenant (drop them, or drop --meters)")
				}
				check := report.Options{From: from, To: to, Format: format}
				if err := check.Validate(); err != nil {
					return usageErr("%v", err)
				}
				out, err := d.open(ctx)
				if err != nil {
					return usageErr("%v", err)
				}
				rep, err := report.ReadMeters(ctx, out, mo)
				if err == nil {
					err = rep.Write(stdout, format)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(stderr, "report took %s\n", time.Since(start).Round(time.Millisecond))
				return nil
			}
			opts := report.Options{Tenant: tenant, Zone: zone, Format: format, From: from, To: to}
			if by == "" {
				by = strings.Join(report.DefaultBy, ",")
			}
			if opts.By, err = report.ParseBy(by); err != nil {
				return usageErr("%v", err)
			}
			if err := opts.Validate(); err != nil {
				return usageErr("%v", err)
			}
			if names != "" {
				if opts.Names, err = report.LoadNames(names); err != nil {
					return usageErr("--names: %v; give the static inventory file (docs/inventory.md)", err)
				}
			}
			out, err := d.open(ctx)
			if err != nil {
				return usageErr("%v", err)
			}
			if err := report.RunOutput(ctx, stdout, out, opts); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "report took %s\n", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	fs := cmd.Flags()
	d.register(fs)
	fs.StringVar(&by, "by", "", "group by these dimensions, comma-separated, in this order: "+report.DimensionNames()+" (default "+strings.Join(report.DefaultBy, ",")+"; with --meters: "+strings.Join(report.MeterDimensions, ", ")+", default "+strings.Join(report.DefaultMeterBy, ",")+")")
	fs.StringVar(&fromS, "from", "", "keep records with time_end ≥ this time (RFC 3339, or YYYY-MM-DD[THH[:MM[:SS]]] in UTC)")
	fs.StringVar(&toS, "to", "", "keep records with time_end < this time (same formats; exclusive)")
	fs.StringVar(&tenant, "tenant", "", "keep only the records of this tenant_id (project ID)")
	fs.StringVar(&zone, "zone", "", "keep only the records of this zone: "+strings.Join(report.Zones, ", "))
	fs.StringVar(&format, "format", "table", "output format: table (aligned, human sizes and a TOTAL line), csv (header and exact integers) or json (docs/queries.md)")
	fs.StringVar(&names, "names", "", "inventory `FILE` (docs/inventory.md) whose project, server, port and LB names are shown next to their IDs")
	fs.BoolVar(&meters, "meters", false, "report meter.v1 (kernel counts and loss per node, tap, direction) instead of flows")
	return cmd
}
