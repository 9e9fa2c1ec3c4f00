package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/report"
)

func init() { register(newBillingCmd) }

const billingLong = `Exact hourly usage for billing (docs/billing.md): after an hour closes
(its end + billing.settle) and its conservation audit passes (tapflow audit
for exactly that hour), the bytes and packets per project, zone, direction,
external network and load balancer are published to a Prometheus
remote-write receiver as tapflow_billed_bytes and tapflow_billed_packets, one
sample per series inside the hour, which CloudKitty rates with
aggregation_method sum. An hour whose audit fails is held back (not
published, counted, logged with the audit's findings) and retried at every
pass. A late file changing a published hour publishes only the
differences (a correction); re-running changes nothing.

With billing.flow_logs.location set, each published hour's tenant flow
logs are then delivered too (each project's records of the hour to its own
S3 location; see tapflow billing flowlogs), after revision 0 and again
after each correction, from the same billing.data; a failed delivery is
retried at the next pass and never holds the publication.

Reads billing.* from --config (docs/config.md): billing.data (default
collector.output; a directory or s3://, read with collector.s3),
billing.prometheus.url and its credentials (password_file or
bearer_token_file, or TAPFLOW_PROMETHEUS_PASSWORD /
TAPFLOW_PROMETHEUS_BEARER_TOKEN: never flags), billing.settle,
billing.interval, billing.lookback, billing.rated_after and
billing.state_dir.`

func newBillingCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "billing <command>",
		Short: "publish exact, audited hourly usage for CloudKitty (run, publish, status) and tenant flow logs (flowlogs)",
		Long:  billingLong,
	}
	return group(cmd, newBillingRunCmd(), newBillingPublishCmd(), newBillingStatusCmd(), newBillingFlowlogsCmd())
}

// billingCorrector, when set (by the file of the rating side's client, in
// its init), builds the hook told about corrections of published hours
// (CloudKitty: a reprocess of the hour for those projects). nil: nobody
// is told; the corrected totals are in Prometheus for the next rating.
var billingCorrector func(cfg config.Config) (usage.Corrector, error)

// billingSetup loads the config and builds the publisher (and its writer
// when publishing; and, with billing.flow_logs.location, the flow-log
// delivery of each published hour, its metrics on reg when not nil).
func billingSetup(ctx context.Context, cf *cfgFlags, publish bool, log *slog.Logger, reg prometheus.Registerer) (*usage.Publisher, config.Config, func(), error) {
	cfg, err := cf.load()
	if err != nil {
		return nil, cfg, nil, err
	}
	u := cfg.Billing.Usage
	if log == nil {
		log = obs.NewLogger(io.Discard, "text", "error")
	}
	var w usage.Writer = refuseWriter{}
	closeFn := func() {}
	if publish {
		if u.Prometheus.URL == "" {
			return nil, cfg, nil, usageErr("billing.prometheus.url is empty in %s: set the remote-write endpoint, e.g. http://127.0.0.1:9090/api/v1/write (Prometheus with --web.enable-remote-write-receiver)", cfgName(cf))
		}
		c, err := promwrite.New(u.Prometheus)
		if err != nil {
			return nil, cfg, nil, usageErr("billing.prometheus: %v", err)
		}
		w, closeFn = c, func() { _ = c.Close() }
	}
	out, err := dataset.Open(ctx, u.Data, dataset.Options{S3: cfg.Collector.S3})
	if err != nil {
		closeFn()
		return nil, cfg, nil, usageErr("billing.data %s: %v", u.Data, err)
	}
	var corr usage.Corrector
	if publish && billingCorrector != nil {
		if corr, err = billingCorrector(cfg); err != nil {
			closeFn()
			return nil, cfg, nil, usageErr("%v", err)
		}
		// The rating side's own metrics (CloudKitty: reprocesses by result).
		if c, ok := corr.(interface{ Collectors() []prometheus.Collector }); ok && reg != nil {
			for _, m := range c.Collectors() {
				if err := reg.Register(m); err != nil {
					closeFn()
					return nil, cfg, nil, fmt.Errorf("billing.cloudkitty metrics: %w", err)
				}
			}
		}
	}
	var delivery usage.Delivery
	if publish && cfg.Billing.FlowLogs.Enabled() {
		// The same output as the usage (billing.data): what was audited
		// is what is delivered.
		d, err := flowlogs.New(cfg.Billing.FlowLogs, out, flowlogs.Options{Logger: log, Registry: reg})
		if err != nil {
			closeFn()
			return nil, cfg, nil, usageErr("%v", err)
		}
		delivery = usage.DeliveryFunc(func(ctx context.Context, h time.Time) error {
			_, err := d.Deliver(ctx, h)
			return err
		})
	}
	p, err := usage.New(usage.Options{Output: out, Writer: w, StateDir: u.StateDir, Settle: u.Settle.D(), Lookback: u.Lookback.D(), Corrector: corr, RatedAfter: u.RatedAfter.D(),
		Delivery: delivery, Logger: log})
	if err != nil {
		closeFn()
		return nil, cfg, nil, usageErr("%v", err)
	}
	return p, cfg, func() { _ = p.Close(); closeFn() }, nil
}

func cfgName(cf *cfgFlags) string {
	if cf.path == "" {
		return "the defaults (no --config)"
	}
	return cf.path
}

// refuseWriter stands in for the receiver in status (which never writes).
type refuseWriter struct{}

func (refuseWriter) Write(context.Context, []promwrite.Series) error {
	return fmt.Errorf("no billing.prometheus.url")
}

func newBillingRunCmd() *cobra.Command {
	var (
		cf       cfgFlags
		duration time.Duration
		once     bool
	)
	cf.required = true
	cmd := &cobra.Command{
		Use:   "run --config FILE [--once] [flags]",
		Short: "publish every closed, audited hour, then again every billing.interval (the service)",
		Long: `Run the billing loop (systemd: tapflow-billing.service): a pass now and one
every billing.interval over the hours that closed within billing.lookback.
A pass publishes each closed hour not yet published whose audit passes,
corrects a published hour whose files changed (a late file: only the
differences), retries held-back hours and failed writes, and skips
everything else. With billing.flow_logs.location set, it then delivers
each project's flow logs of every hour it published or corrected (the
files the audit passed; billing.flow_logs.s3 credentials), once per change
of the hour's files, retrying a failed delivery (a missing bucket, access
denied) at every pass without touching the publication. Metrics on
metrics.listen (--metrics-listen): tapflow_billing_* and, with flow logs,
tapflow_flowlogs_* (docs/operations.md). SIGINT/SIGTERM stop it between
hours; the state (billing.state_dir) makes a restart pick up where it
stopped.

With --once: one pass, what it did printed, then exit (a systemd timer or
cron instead of the service; no metrics): 0 when the pass succeeded and
held nothing back, 1 when it failed or held an hour back.`,
		Example: `  tapflow billing run --config /etc/tapflow/tapflow.yaml --metrics-listen 127.0.0.1:9467
  tapflow billing run --config /etc/tapflow/tapflow.yaml --once`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			holdHangups()
			ctx, _, log, stop, err := cf.loadRun(cmd, duration)
			if err != nil {
				return err
			}
			defer stop()
			reg := obs.NewRegistry()
			var mreg prometheus.Registerer = reg
			if once {
				mreg = nil // no metrics served
			}
			p, cfg, closeFn, err := billingSetup(ctx, &cf, true, log, mreg)
			if err != nil {
				return err
			}
			defer closeFn()
			if once {
				return billingOnce(ctx, cmd.OutOrStdout(), p)
			}
			reg.MustRegister(p.Collectors()...)
			if cfg.Metrics.Listen != "" {
				srv, err := obs.Listen(cfg.Metrics.Listen, reg, obs.ServerOptions{Pprof: cfg.Metrics.Pprof})
				if err != nil {
					return usageErr("%v", err)
				}
				go func() { _ = srv.Run(ctx) }()
			}
			u := cfg.Billing.Usage
			log.Info("tapflow billing starting", "data", u.Data, "settle", u.Settle.String(), "interval", u.Interval.String(),
				"lookback", u.Lookback.String(), "state_dir", u.StateDir, "metrics", cfg.Metrics.Listen)
			if err := p.Run(ctx, u.Interval.D()); err != nil {
				log.Error("tapflow billing failed", "err", err)
				return exitCode(exitRuntime)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	cf.bindConfig(fs, "read the config from `FILE` (billing.*, collector.output and collector.s3; docs/config.md)")
	cf.bindObs(fs, true)
	fs.DurationVar(&duration, "duration", 0, "stop after this long (e.g. 1m; 0 = until SIGINT/SIGTERM)")
	fs.BoolVar(&once, "once", false, "run one pass, print what it did and exit (1 if it failed or held an hour back)")
	return cmd
}

// billingOnce is run --once.
func billingOnce(ctx context.Context, w io.Writer, p *usage.Publisher) error {
	outs, err := p.Pass(ctx)
	held := false
	for _, o := range outs {
		printOutcome(w, o)
		held = held || o.Action == usage.ActHeld
	}
	if len(outs) == 0 && err == nil {
		fmt.Fprintln(w, "nothing to do: every closed hour is published and unchanged")
	}
	if err != nil {
		return err
	}
	if held {
		return exitCode(exitRuntime)
	}
	return nil
}

func newBillingPublishCmd() *cobra.Command {
	var (
		cf    cfgFlags
		hourS string
		force bool
	)
	cf.required = true
	cmd := &cobra.Command{
		Use:   "publish --config FILE --hour YYYY-MM-DDTHH [--force]",
		Short: "publish (or correct, or hold back) one closed hour now; idempotent",
		Long: `Process one hour as a pass of tapflow billing run would: audit it, and if the
audit passes publish its totals (revision 0), or, when it was published
before and its files changed, the differences (a correction). Publishing an
hour again when nothing changed writes nothing. An hour whose audit fails
is held back and the findings printed.

The hour must be closed (its end + billing.settle is past) unless --force:
files of a running pipeline may still land in it (they would become a
correction later).

Exit codes: 0 published, corrected or unchanged; 1 held back or a failure;
2 usage; 3 nothing to publish (no record in the hour).`,
		Example: `  tapflow billing publish --config /etc/tapflow/tapflow.yaml --hour 2026-12-04T05`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if hourS == "" {
				return usageHint("--hour is required (YYYY-MM-DDTHH, UTC)")
			}
			h, err := report.ParseTime(hourS)
			if err != nil {
				return usageErr("--hour %v", err)
			}
			if !h.Equal(h.Truncate(time.Hour)) {
				return usageErr("--hour %s is not the start of an hour; give YYYY-MM-DDTHH (UTC)", hourS)
			}
			ctx, stop := signalContext()
			defer stop()
			p, cfg, closeFn, err := billingSetup(ctx, &cf, true, nil, nil)
			if err != nil {
				return err
			}
			defer closeFn()
			if !force && !p.Closed(h) {
				return usageErr("hour %s is not closed until %s (its end + billing.settle %s); wait, or give --force", h.Format("2006-01-02T15"),
					h.Add(time.Hour+cfg.Billing.Usage.Settle.D()).Format(time.RFC3339), cfg.Billing.Usage.Settle)
			}
			start := time.Now()
			o, err := p.Hour(ctx, h)
			if err != nil {
				return fmt.Errorf("hour %s: %w", h.Format("2006-01-02T15"), err)
			}
			w := cmd.OutOrStdout()
			printOutcome(w, o)
			fmt.Fprintf(cmd.ErrOrStderr(), "publish took %s\n", time.Since(start).Round(time.Millisecond))
			switch o.Action {
			case usage.ActHeld:
				return exitCode(exitRuntime)
			case usage.ActEmpty:
				return exitCode(exitNothingChecked)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	cf.bindConfig(fs, "read the config from `FILE` (billing.*, collector.output and collector.s3; docs/config.md)")
	fs.StringVar(&hourS, "hour", "", "the hour to publish: YYYY-MM-DDTHH (UTC), e.g. 2026-12-04T05 for [05:00, 06:00)")
	fs.BoolVar(&force, "force", false, "publish an hour that has not closed yet (its end + billing.settle still ahead)")
	return cmd
}

func printOutcome(w io.Writer, o usage.Outcome) {
	b, pk := o.Totals.Sum()
	fmt.Fprintf(w, "hour %s: %s (revision %d, %d series written; totals %d bytes, %d packets over %d keys)\n",
		o.Hour.Format("2006-01-02T15Z"), o.Action, o.Revision, o.Series, b, pk, len(o.Totals))
	for _, f := range o.Findings {
		fmt.Fprintln(w, "  MISMATCH", f)
	}
}

func newBillingStatusCmd() *cobra.Command {
	var (
		cf     cfgFlags
		format string
	)
	cf.required = true
	cmd := &cobra.Command{
		Use:   "status --config FILE [--format table|json]",
		Short: "what was published per hour: status, revision, totals, held-back findings",
		Long: `Print the billing state (billing.state_dir): per hour its status (published,
held, empty), the last revision published, the totals the receiver holds,
pending writes and corrections not yet taken by the rating side. It reads
no data and writes nothing.`,
		Example: `  tapflow billing status --config /etc/tapflow/tapflow.yaml
  tapflow billing status --config /etc/tapflow/tapflow.yaml --format json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usageErr("--format %q: use table or json", format)
			}
			p, _, closeFn, err := billingSetup(context.Background(), &cf, false, nil, nil)
			if err != nil {
				return err
			}
			defer closeFn()
			states, err := p.Status()
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if format == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(states)
			}
			tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "hour\tstatus\trevision\tkeys\tbytes\tpackets\tpending\tunreprocessed\tupdated")
			for _, s := range states {
				b, pk := s.Totals.Sum()
				pending := "-"
				if s.Pending != nil {
					pending = fmt.Sprintf("revision %d", s.Pending.Revision)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\n", s.Hour.Format("2006-01-02T15Z"), s.Status, s.Revision, len(s.Totals), b, pk,
					pending, len(s.Unreprocessed), s.UpdatedAt.Format(time.RFC3339))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, s := range states {
				for _, f := range s.Findings {
					fmt.Fprintf(w, "%s MISMATCH %s\n", s.Hour.Format("2006-01-02T15Z"), f)
				}
			}
			return nil
		},
	}
	fs := cmd.Flags()
	cf.bindConfig(fs, "read the config from `FILE` (billing.state_dir; docs/config.md)")
	fs.StringVar(&format, "format", "table", "table or json")
	return cmd
}
