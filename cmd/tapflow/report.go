package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/report"
)

func init() { register(newReportCmd) }

func newReportCmd() *cobra.Command {
	var data, by, fromS, toS, tenant, zone, format, names string
	cmd := &cobra.Command{
		Use:   "report --data DIR [flags]",
		Short: "bytes and packets by tenant, zone, server, LB… over a time range (table, CSV, JSON)",
		Long: `Read the committed Parquet files under DIR/flows and print records, packets
and bytes per group (default: tenant × zone × direction), with totals.

Time range: records with --from ≤ time_end < --to (either may be left out).
Partitions (hours of time_end, UTC) outside the range are not read, and
rows inside the partitions at its edges are filtered one by one, so the
sums are exact to the microsecond. Times without a zone are UTC.`,
		Example: `  tapflow report --data /var/lib/tapflow --by tenant,zone,direction,external_network
  tapflow report --data /var/lib/tapflow --from 2026-11-01 --to 2026-12-01 --by tenant --format csv
  tapflow report --data /var/lib/tapflow --tenant 4f0c… --by server,port --names /etc/tapflow/inventory.yaml`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				return usageHint("--data is required (the collector output directory)")
			}
			opts := report.Options{Tenant: tenant, Zone: zone, Format: format}
			var err error
			if opts.By, err = report.ParseBy(by); err != nil {
				return usageErr("%v", err)
			}
			for _, t := range []struct {
				flag string
				s    string
				dst  *time.Time
			}{{"--from", fromS, &opts.From}, {"--to", toS, &opts.To}} {
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
			if names != "" {
				if opts.Names, err = report.LoadNames(names); err != nil {
					return usageErr("--names: %v; give the static inventory file (docs/inventory.md)", err)
				}
			}
			start := time.Now()
			if err := report.Run(cmd.OutOrStdout(), data, opts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "report took %s\n", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&data, "data", "", "`DIR` holding flows/dt=…/hour=…/*.parquet (the collector output)")
	fs.StringVar(&by, "by", strings.Join(report.DefaultBy, ","), "group by these dimensions, comma-separated, in this order: "+report.DimensionNames())
	fs.StringVar(&fromS, "from", "", "keep records with time_end ≥ this time (RFC 3339, or YYYY-MM-DD[THH[:MM[:SS]]] in UTC)")
	fs.StringVar(&toS, "to", "", "keep records with time_end < this time (same formats; exclusive)")
	fs.StringVar(&tenant, "tenant", "", "keep only the records of this tenant_id (project ID)")
	fs.StringVar(&zone, "zone", "", "keep only the records of this zone: "+strings.Join(report.Zones, ", "))
	fs.StringVar(&format, "format", "table", "output format: table (aligned, human sizes and a TOTAL line), csv (header and exact integers) or json (docs/queries.md)")
	fs.StringVar(&names, "names", "", "inventory `FILE` (docs/inventory.md) whose project, server, port and LB names are shown next to their IDs")
	return cmd
}
