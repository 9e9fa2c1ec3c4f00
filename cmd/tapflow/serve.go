package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
)

func init() {
	register(newServeCmd("run", "agent + collector + embedded NATS in one process (the default deployment)",
		`Run agent, collector and an embedded NATS server (JetStream in <data_dir>/nats)
in one process, unless nats.url names an external server. SIGINT/SIGTERM stop
it gracefully: the source stops, every batch in flight is published, the
collector drains the stream, commits its Parquet files and acks them.`,
		true, app.RunAll))
	register(newServeCmd("agent", "capture (or synthesize) flows, attribute them, publish batches to NATS",
		`Run the agent: source (synthetic or ebpf) → attribution → batches published to
NATS JetStream (nats.url, or an embedded server when empty). SIGHUP (or
POST /-/refresh on metrics.listen) reconciles the inventory now;
SIGINT/SIGTERM export every flow the kernel holds, publish what is in flight,
then exit. With source ebpf and capture.pin_dir (the default) on a bpffs that
outlives the agent, the programs stay attached and counting and the next start
adopts what came in meanwhile, even after a SIGKILL (a pin that will not
outlive the agent is reported at start; every stop then detaches). --detach
makes a run the last one: its stop also removes the programs and the pinned
state (uninstall; docs/operations.md).`,
		false, app.RunAgent))
	register(newServeCmd("collector", "consume batches from NATS and write hourly-partitioned Parquet",
		`Run the collector: durable JetStream consumer → Parquet files under
<collector.output>/flows/dt=YYYY-MM-DD/hour=HH/. Messages are acked only after
the file holding them is committed (fsync + rename).`,
		true, app.RunCollector))
}

// newServeCmd builds run, agent or collector; writesOutput says whether
// the command writes Parquet (and so has --output).
func newServeCmd(name, short, long string, writesOutput bool, runFn func(context.Context, config.Config, *slog.Logger) error) func() *cobra.Command {
	return func() *cobra.Command {
		var (
			cf       cfgFlags
			duration time.Duration
			detach   bool
		)
		cmd := &cobra.Command{
			Use:   name + " [flags]",
			Short: short,
			Long:  long,
			Args:  noArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				holdHangups()
				ctx, cfg, log, stop, err := cf.loadRun(cmd, duration)
				if err != nil {
					return err
				}
				defer stop()
				if detach {
					cfg.Capture.Detach = true
				}
				if err := runFn(ctx, cfg, log); err != nil {
					log.Error("tapflow "+name+" failed", "err", err)
					return exitCode(exitRuntime)
				}
				return nil
			},
		}
		fs := cmd.Flags()
		cf.bindConfig(fs, "read the config from `FILE` (YAML; see deploy/examples/tapflow.yaml). Without it, defaults apply")
		cf.bindDataDir(fs, "override data_dir with `DIR`: embedded NATS store, agent state, default Parquet output")
		cf.bindNATSURL(fs)
		cf.bindNode(fs, "override node with `NAME` (default: hostname)")
		if writesOutput {
			cf.bindOutput(fs)
		}
		cf.bindObs(fs, true)
		fs.DurationVar(&duration, "duration", 0, "stop gracefully after this long (e.g. 20s; 0 = until SIGINT/SIGTERM)")
		if name != "collector" {
			fs.BoolVar(&detach, "detach", false, "source ebpf: make this run the last one (uninstall): at stop, detach from every tap before exporting every flow, and remove the programs and the pinned state in capture.pin_dir (every stop exports the flows; without --detach the programs stay attached and counting for the next run)")
		}
		return cmd
	}
}
