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
	"strings"
	"syscall"
	"time"

	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/report"
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
  report     bytes and packets by tenant, zone, server, LB… over a time range (table, CSV, JSON)
  lab        a mini OpenStack cloud in network namespaces: up, down, run, drive, scenario (docs/lab.md)
  spool      inspect, verify or repair an agent spool directory (tapflow spool inspect|verify|repair DIR)
  dlq        list dead letters the collector rejected, replay them once fixed (tapflow dlq inspect|replay)
  tap        print flow records live from NATS, filtered by tenant, zone, node, port; never disturbs the collector
  inventory  inventory dump|confirm|serve: print what the provider sees, apply a held drop, run the metadata service
  capture    capture status|detach: show or remove the capture state pinned in bpffs (capture.pin_dir)
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
	case "inventory":
		return inventoryCmd(rest, stdout, stderr)
	case "capture":
		return captureCmd(rest, stdout, stderr)
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
SIGINT/SIGTERM publish what is in flight, then exit. With source ebpf and
capture.pin_dir (the default) the programs stay attached and the kernel table
and ring stay pinned: the next start adopts them and loses nothing, even after
a SIGKILL. --detach makes a run the last one: its stop exports everything and
removes the pinned state (uninstall; docs/operations.md).`,
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
	var detach *bool
	if cmd != "collector" {
		detach = fs.Bool("detach", false, "source ebpf: make this run the last one (uninstall): at stop, detach from every tap, export every flow still in the kernel and remove the pinned state in capture.pin_dir (without it a stop leaves the programs attached and the state pinned for the next run)")
	}
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
		if detach != nil && *detach {
			c.Capture.Detach = true
		}
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
