package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/audit"
	"github.com/tapflow/tapflow/internal/report"
)

func init() { register(newAuditCmd) }

// exitNothingChecked is tapflow audit's exit code when it checked no
// key-hour (an empty output, or every hour outside the range, e.g. newer
// than --settle): not a pass.
const exitNothingChecked = 3

func newAuditCmd() *cobra.Command {
	var (
		d          dataFlags
		fromS, toS string
		settle     time.Duration
		all        bool
		slack      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "audit --data DIR|s3://bucket/prefix [--from T] [--to T] [--settle D] [--all]",
		Short: "check byte conservation (flows against kernel meters) per node, tap, direction and hour",
		Long: `Check byte conservation on a collector output: for every node, tap, direction
and hour, Σ flow.v1 bytes and packets against Σ meter.v1 bytes and packets
minus the loss the kernel reported. The check is cumulative over the hours
of each key: the running difference may only be what the flow records and
meter intervals crossing an hour's edge carry, and must be exactly zero at
the end of the data. Every mismatch names the node, tap, direction, hour and
difference. Meters come from agents with source: ebpf. The same check as a
DuckDB query: docs/queries.md (Conservation).

Without --to, the hours ending after now − --settle are left out (files of
a running pipeline may still be written); the output names every hour left
out and why. An audit that checked no hour passes nothing: right after a
run use --settle 0 (a stopped pipeline), or wait.

Exit codes: 0 conserved, 1 mismatch or read error, 2 usage, 3 nothing
checked (no flow or meter record in the range: an empty output, or every
hour left out by --from/--to/--settle).`,
		Example: `  tapflow audit --data /var/lib/tapflow
  tapflow audit --data s3://billing-lake/tapflow --config /etc/tapflow/tapflow.yaml --from 2026-12-01 --to 2026-12-02`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := audit.Options{ClockSlack: slack}
			var err error
			if fromS != "" {
				if opts.From, err = report.ParseTime(fromS); err != nil {
					return usageErr("--from %v", err)
				}
			}
			if toS != "" {
				if opts.To, err = report.ParseTime(toS); err != nil {
					return usageErr("--to %v", err)
				}
			} else if settle > 0 {
				opts.To = time.Now().Add(-settle).UTC().Truncate(time.Hour)
				opts.Settle = settle
			}
			if !opts.From.IsZero() && !opts.To.IsZero() && !opts.From.Before(opts.To) {
				return usageErr("--from %s is not before --to %s (with --settle, --to defaults to now − settle, to the hour)", opts.From.Format(time.RFC3339), opts.To.Format(time.RFC3339))
			}
			ctx := context.Background()
			out, err := d.open(ctx)
			if err != nil {
				return usageErr("%v", err)
			}
			r, err := audit.Run(ctx, out, opts)
			if err != nil {
				return err
			}
			if err := r.Print(cmd.OutOrStdout(), all); err != nil {
				return err
			}
			switch r.Verdict() {
			case audit.Mismatched:
				return exitCode(exitRuntime)
			case audit.NothingChecked:
				return exitCode(exitNothingChecked)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	d.register(fs)
	fs.StringVar(&fromS, "from", "", "check hours from this one (time_end ≥ T, whole hours; RFC 3339 or YYYY-MM-DD[THH], UTC)")
	fs.StringVar(&toS, "to", "", "check hours before this one (exclusive; same formats). Default: now − --settle, to the hour")
	fs.DurationVar(&settle, "settle", 15*time.Minute, "without --to, leave out the hours ending after now − this (files still being written: roll_age, active timeout); 0 checks everything")
	fs.BoolVar(&all, "all", false, "print every key and hour, not just the mismatches")
	fs.DurationVar(&slack, "clock-slack", audit.DefaultClockSlack, "how far a record's times may be off an hour's edge and still count as crossing it (kernel coarse clock vs wall clock)")
	return cmd
}
