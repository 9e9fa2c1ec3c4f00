// Command tapflow is the flow-log pipeline for OpenStack clouds: per-tenant,
// byte-exact traffic records from VM taps to Parquet. See `tapflow help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/version"
	"github.com/tapflow/tapflow/transport"
)

const usage = `tapflow — per-tenant, byte-exact flow records for OpenStack clouds

Usage:
  tapflow <command> [flags]

Commands:
  run        agent + collector + embedded NATS in one process (the default deployment)
  agent      capture (or synthesize) flows, attribute them, publish batches to NATS
  collector  consume batches from NATS and write hourly-partitioned Parquet
  report     bytes and packets by day, hour, tenant, zone, server, LB… over a time range, from a directory or s3://; --meters: kernel meters
  audit      check conservation per node, tap, direction and hour: Σ flow bytes = meter bytes − loss (directory or s3://)
  top        per-stage records/s, queue depth, lag and errors from one or more /metrics endpoints, live
  lab        a mini OpenStack cloud in network namespaces: up, down, run, drive, scenario (docs/lab.md)
  spool      inspect, verify or repair an agent spool directory (tapflow spool inspect|verify|repair DIR)
  dlq        list dead letters the collector rejected, replay them once fixed (tapflow dlq inspect|replay)
  tap        print flow records live from NATS, filtered by tenant, zone, node, port; never disturbs the collector
  inventory  inventory dump|confirm|serve: print what the provider sees, apply a held drop, run the metadata service
  validate   check a config file and list every problem
  version    print the version

Run 'tapflow <command> --help' for the flags of a command.
Docs: docs/config.md (every config key), docs/operations.md (metrics, signals).
`

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2 // bad flags or config
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run", "agent", "collector":
		return serve(cmd, rest, stderr)
	case "report":
		return reportCmd(rest, stdout, stderr)
	case "audit":
		return auditCmd(rest, stdout, stderr)
	case "top":
		return topCmd(rest, stdout, stderr)
	case "inventory":
		return inventoryCmd(rest, stdout, stderr)
	case "lab":
		return labCmd(rest, stdout, stderr)
	case "spool":
		return spoolCmd(rest, stdout, stderr)
	case "dlq":
		return dlqCmd(rest, stdout, stderr)
	case "tap":
		return tapCmd(rest, stdout, stderr)
	case "validate":
		return validateCmd(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "tapflow", version.Version)
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "tapflow: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
}

var serveHelp = map[string]string{
	"run": `Run agent, collector and an embedded NATS server (JetStream in <data_dir>/nats)
in one process, unless nats.url names an external server. SIGINT/SIGTERM stop
it gracefully: the source stops, every batch in flight is published, the
collector drains the stream, commits its Parquet files and acks them.`,
	"agent": `Run the agent: source (synthetic or ebpf) → attribution → batches published to
NATS JetStream (nats.url, or an embedded server when empty). SIGHUP (or
POST /-/refresh on metrics.listen) reconciles the inventory now;
SIGINT/SIGTERM publish what is in flight, then exit.`,
	"collector": `Run the collector: durable JetStream consumer → Parquet files under
<collector.output>/flows/dt=YYYY-MM-DD/hour=HH/. Messages are acked only after
the file holding them is committed (fsync + rename).`,
}

func serve(cmd string, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (YAML; see deploy/examples/tapflow.yaml). Without it, defaults apply")
	dataDir := fs.String("data-dir", "", "override data_dir: embedded NATS store, agent state, default Parquet output")
	natsURL := fs.String("nats-url", "", "override nats.url: use this external NATS instead of the embedded one")
	node := fs.String("node", "", "override node (default: hostname)")
	output := fs.String("output", "", "override collector.output: a directory or s3://bucket/prefix (flows/dt=…/hour=…/ below it)")
	duration := fs.Duration("duration", 0, "stop gracefully after this long (e.g. 20s; 0 = until SIGINT/SIGTERM)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tapflow %s [flags]\n\n%s\n\nFlags:\n", cmd, serveHelp[cmd])
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if err := transport.CheckFlagURL(*natsURL); err != nil {
		fmt.Fprintf(stderr, "tapflow %s: --nats-url: %v\n", cmd, err)
		return exitUsage
	}
	cfg, err := loadConfig(*cfgPath, func(c *config.Config) {
		set(&c.DataDir, *dataDir)
		set(&c.NATS.URL, *natsURL)
		set(&c.Node, *node)
		set(&c.Collector.Parquet.Output, *output)
	})
	if err != nil {
		fmt.Fprintf(stderr, "tapflow %s: invalid config:\n%s\n", cmd, indent(err))
		return exitUsage
	}
	log := obs.NewLogger(stderr, cfg.Log.Format, cfg.Log.Level)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	var runErr error
	switch cmd {
	case "run":
		runErr = app.RunAll(ctx, cfg, log)
	case "agent":
		runErr = app.RunAgent(ctx, cfg, log)
	case "collector":
		runErr = app.RunCollector(ctx, cfg, log)
	}
	if runErr != nil {
		log.Error("tapflow "+cmd+" failed", "err", runErr)
		return exitRuntime
	}
	return exitOK
}

func set(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// loadConfig reads path (or the defaults), applies flag overrides, then
// resolves and validates the result.
func loadConfig(path string, override func(*config.Config)) (config.Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return config.Config{}, fmt.Errorf("read config: %w", err)
		}
	}
	cfg, err := config.Decode(data)
	if err != nil {
		return cfg, err
	}
	override(&cfg)
	cfg.Resolve()
	return cfg, cfg.Validate()
}

func indent(err error) string {
	var out string
	for _, line := range splitLines(err.Error()) {
		out += "  - " + line + "\n"
	}
	return out
}

func splitLines(s string) []string {
	var lines []string
	start := 0
	for i := range len(s) {
		if s[i] == '\n' {
			lines = append(lines, s[start:i])
			start = i + 1
		}
	}
	return append(lines, s[start:])
}

func validateCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: tapflow validate FILE\n\nCheck a config file without running anything. Lists every bad field with its\npath and the fix; exit code 2 when there is any.\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	if _, err := config.Load(fs.Arg(0)); err != nil {
		fmt.Fprintf(stderr, "%s: invalid:\n%s", fs.Arg(0), indent(err))
		return exitUsage
	}
	fmt.Fprintf(stdout, "%s: ok\n", fs.Arg(0))
	return exitOK
}
