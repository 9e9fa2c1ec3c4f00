package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/report"
)

func newBillingFlowlogsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "flowlogs <command>",
		Short: "tenant flow logs: each project's records of an hour, to its own S3 location",
		Long: `Tenant flow logs: for one closed hour, each project's flow records of that
hour (its own ports' records; never those where it is only the peer) go to
the project's own S3 location, billing.flow_logs.location with {project_id}
in the bucket or the prefix, as one Parquet object with the AWS VPC Flow
Logs v5 field names plus tapflow's zone, external_network and lb columns.
Field mapping and object layout: docs/billing.md (Tenant flow logs).`,
	}
	return group(cmd, newFlowlogsDeliverCmd())
}

func newFlowlogsDeliverCmd() *cobra.Command {
	var (
		cf    = cfgFlags{required: true}
		hourS string
		data  string
	)
	cmd := &cobra.Command{
		Use:   "deliver --hour YYYY-MM-DDTHH --config FILE [--data DIR|s3://bucket/prefix]",
		Short: "deliver one hour's flow logs to every project's location (idempotent)",
		Long: `Deliver one hour's flow logs: read the collector output's flows of the
hour (time_end in [hour, hour+1h): the dt=/hour= partition; collector.output
and collector.s3 of --config, or --data), write each project's records to
billing.flow_logs.staging_dir and upload them to its location with the
credentials of billing.flow_logs.s3, at
<location>/year=YYYY/month=MM/day=DD/hour=HH/<project>_tapflow_<YYYYMMDDTHH>00Z.parquet.

Deliver an hour once it is closed and 'tapflow audit' passed for it (the
billing loop does both); delivering it again overwrites the same objects,
so a correction (a late record) is delivered by delivering the hour again.
A project whose location fails (bucket missing, access denied) does not
stop the others; each failure names the project and the fix.

Exit codes: 0 delivered to every project, 1 a project or the source failed,
2 usage or config error.`,
		Example: `  tapflow billing flowlogs deliver --hour 2026-12-04T05 --config /etc/tapflow/tapflow.yaml
  tapflow billing flowlogs deliver --hour 2026-12-04T05 --config /etc/tapflow/billing.yaml --data s3://billing-lake/tapflow`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hour, err := parseHour(hourS, time.Now())
			if err != nil {
				return usageErr("--hour: %v", err)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			if !cfg.Billing.FlowLogs.Enabled() {
				return usageErr("billing.flow_logs.location is not set in %s; set it, e.g. s3://flowlogs-{project_id}/tapflow (docs/config.md)", cf.path)
			}
			log := obs.NewLogger(cmd.ErrOrStderr(), cfg.Log.Format, cfg.Log.Level)
			ctx, stop := signalContext()
			defer stop()
			output := cfg.Collector.Parquet.Output
			set(&output, data)
			src, err := dataset.Open(ctx, output, dataset.Options{S3: cfg.Collector.S3})
			if err != nil {
				return usageErr("collector output %s: %v", output, err)
			}
			d, err := flowlogs.New(cfg.Billing.FlowLogs, src, flowlogs.Options{Logger: log})
			if err != nil {
				return usageErr("%v", err)
			}
			res, derr := d.Deliver(ctx, hour)
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "hour %s: %d source files, %d records\n", hour.Format("2006-01-02T15Z"), res.Files, res.SourceRecords)
			fmt.Fprintln(tw, "project\trecords\tpackets\tbytes\tobject")
			for _, p := range res.Projects {
				where := p.URL
				if p.Err != nil {
					where = "FAILED (below)"
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", p.ID, p.Records, p.Packets, p.Bytes, where)
			}
			for _, reason := range []string{flowlogs.SkipUnknownTenant, flowlogs.SkipNotListed} {
				if n := res.Skipped[reason]; n > 0 {
					fmt.Fprintf(tw, "not delivered (%s): %d records\n", reason, n)
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			return derr
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&hourS, "hour", "", "the hour to deliver, UTC: `YYYY-MM-DDTHH` (or RFC 3339 at a whole hour); it must be over")
	fs.StringVar(&data, "data", "", "the collector output to read: a `DIR` or s3://bucket/prefix (default collector.output; collector.s3 reads an s3:// one)")
	cf.bindConfig(fs, "config `FILE` with billing.flow_logs (location, projects, s3 credentials) and collector.output/collector.s3 (required)")
	cf.bindDataDir(fs, "override data_dir with `DIR` (the default collector.output and billing.flow_logs.staging_dir are below it)")
	cf.bindObs(fs, false)
	return cmd
}

// parseHour parses --hour: a whole hour that is over at now.
func parseHour(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, fmt.Errorf("required; give the hour to deliver, e.g. --hour %s", now.UTC().Add(-2*time.Hour).Format("2006-01-02T15"))
	}
	t, err := report.ParseTime(s)
	if err != nil {
		return t, err
	}
	if !t.Equal(t.Truncate(time.Hour)) {
		return t, fmt.Errorf("%s is not a whole hour; use e.g. %s", s, t.Truncate(time.Hour).Format("2006-01-02T15"))
	}
	if t.Add(time.Hour).After(now) {
		return t, fmt.Errorf("hour %s is not over yet (it ends at %s); deliver it once it is closed and audited", t.Format("2006-01-02T15Z"), t.Add(time.Hour).Format(time.RFC3339))
	}
	return t, nil
}
