package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/transport"
)

// exitError carries a command's exit code to run; err (if any) is printed
// as "<command path>: <err>", hint adds "Run '… --help' for usage".
type exitError struct {
	code int
	err  error
	hint bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErr is a bad flag value or argument: exit 2.
func usageErr(format string, a ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, a...)}
}

// usageHint is usageErr plus the pointer to --help.
func usageHint(format string, a ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, a...), hint: true}
}

// exitCode ends a command that already printed what went wrong.
func exitCode(code int) error {
	if code == exitOK {
		return nil
	}
	return &exitError{code: code}
}

// noArgs refuses positional arguments of a flags-only command.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErr("unexpected argument %q; flags only (see %s --help)", args[0], cmd.CommandPath())
	}
	return nil
}

// exactArgs wants n positional arguments, described by what.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageHint("give %s", what)
		}
		return nil
	}
}

// group makes cmd a parent of subs: alone it prints its help on stderr
// and exits 2; with an unknown subcommand it names the known ones.
func group(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.AddCommand(subs...)
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		var names []string
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		if len(args) == 0 {
			c.SetOut(c.ErrOrStderr())
			_ = c.Help()
			return &exitError{code: exitUsage}
		}
		hint := ""
		c.SuggestionsMinimumDistance = 2 // cobra's default for the root
		if sug := c.SuggestionsFor(args[0]); len(sug) > 0 {
			hint = " (did you mean " + strings.Join(sug, " or ") + "?)"
		}
		return usageHint("unknown command %q%s; use %s", args[0], hint, strings.Join(names, "|"))
	}
	return cmd
}

// signalContext ends at SIGINT/SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// holdHangups keeps SIGHUP from killing a daemon command (run, agent,
// collector, inventory serve) in the moments before the app catches it
// (flags, config): a channel registered for a signal replaces Go's
// default action, which is to exit. The channel is never read; the app
// registers its own and logs each SIGHUP. One this early finds no config
// read yet, so dropping it loses no reload.
func holdHangups() { signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP) }

// loadRun is the start of a command that logs and runs until stopped: it
// loads the config, makes the logger the config asks for and a context
// that ends at SIGINT/SIGTERM or, when duration > 0, after duration.
// stop releases the context.
func (f *cfgFlags) loadRun(cmd *cobra.Command, duration time.Duration) (ctx context.Context, cfg config.Config, log *slog.Logger, stop func(), err error) {
	if cfg, err = f.load(); err != nil {
		return nil, cfg, nil, nil, err
	}
	log = obs.NewLogger(cmd.ErrOrStderr(), cfg.Log.Format, cfg.Log.Level)
	ctx, stopSignals := signalContext()
	if duration <= 0 {
		return ctx, cfg, log, stopSignals, nil
	}
	ctx, cancel := context.WithTimeout(ctx, duration)
	return ctx, cfg, log, func() { cancel(); stopSignals() }, nil
}

// cfgFlags is the --config family shared by the commands that read the
// config file: each command binds the overrides that mean something to it,
// and load applies them the same way everywhere.
type cfgFlags struct {
	path     string
	required bool // --config must be given

	dataDir, natsURL, node, output string

	// --log-level, --log-format, --metrics-listen: bound by the commands
	// that log or serve metrics (bindObs).
	logLevel, logFormat, metricsListen string
	fs                                 *pflag.FlagSet // to tell --metrics-listen "" from unset
}

// bindObs adds --log-level and --log-format, and --metrics-listen when
// the command serves /metrics.
func (f *cfgFlags) bindObs(fs *pflag.FlagSet, metrics bool) {
	f.fs = fs
	fs.StringVar(&f.logLevel, "log-level", "", "override log.level with `LEVEL`: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "", "override log.format with `FORMAT`: json or text")
	if metrics {
		fs.StringVar(&f.metricsListen, "metrics-listen", "", "override metrics.listen with `HOST:PORT`, the address of /metrics and /healthz (\"\" disables)")
	}
}

// bindConfig adds --config with a command-specific description.
func (f *cfgFlags) bindConfig(fs *pflag.FlagSet, usage string) {
	fs.StringVar(&f.path, "config", "", usage)
}

func (f *cfgFlags) bindNATSURL(fs *pflag.FlagSet) {
	fs.StringVar(&f.natsURL, "nats-url", "", "override nats.url: connect to the NATS at `URL` (no credentials here: they would show in ps; use nats.user and nats.password_file)")
}

func (f *cfgFlags) bindDataDir(fs *pflag.FlagSet, usage string) {
	fs.StringVar(&f.dataDir, "data-dir", "", usage)
}

func (f *cfgFlags) bindNode(fs *pflag.FlagSet, usage string) {
	fs.StringVar(&f.node, "node", "", usage)
}

func (f *cfgFlags) bindOutput(fs *pflag.FlagSet) {
	fs.StringVar(&f.output, "output", "", "override collector.output with `DIR` or s3://bucket/prefix (flows/dt=…/hour=…/ below it)")
}

// load reads --config (or the defaults), applies the overrides, resolves
// and validates. Every failure is a usage error (exit 2).
func (f *cfgFlags) load() (config.Config, error) {
	if f.required && f.path == "" {
		return config.Config{}, usageHint("--config FILE is required")
	}
	if err := transport.CheckFlagURL(f.natsURL); err != nil {
		return config.Config{}, usageErr("--nats-url: %v", err)
	}
	if f.logLevel != "" && !contains(config.LogLevels, f.logLevel) {
		return config.Config{}, usageErr("--log-level %q: use %s", f.logLevel, strings.Join(config.LogLevels, ", "))
	}
	if f.logFormat != "" && !contains(config.LogFormats, f.logFormat) {
		return config.Config{}, usageErr("--log-format %q: use %s", f.logFormat, strings.Join(config.LogFormats, " or "))
	}
	metricsSet := f.fs != nil && f.fs.Changed("metrics-listen")
	cfg, err := loadConfig(f.path, func(c *config.Config) {
		set(&c.DataDir, f.dataDir)
		set(&c.NATS.URL, f.natsURL)
		set(&c.Node, f.node)
		set(&c.Collector.Parquet.Output, f.output)
		set(&c.Log.Level, f.logLevel)
		set(&c.Log.Format, f.logFormat)
		if metricsSet {
			c.Metrics.Listen = f.metricsListen
		}
	})
	if err != nil {
		return cfg, usageErr("invalid config:\n%s", indent(err))
	}
	return cfg, nil
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
	return config.ParseWith(data, override)
}

// natsTarget is the NATS a client command (tap, dlq) connects to:
// nats.url, or the nats.listen address of an embedded server.
func natsTarget(cfg config.Config) (transport.Config, error) {
	ncfg := cfg.NATS
	if ncfg.URL == "" && ncfg.Listen != "" {
		ncfg.URL = "nats://" + ncfg.Listen
	}
	if ncfg.URL == "" {
		return ncfg, usageErr("no NATS to connect to: nats.url is empty and nats.listen is not set, so an embedded server is reachable only inside its own process; set nats.listen (e.g. 127.0.0.1:4222) on the running tapflow, or give --nats-url / --config with nats.url")
	}
	return ncfg, nil
}

// cliConnectTimeout bounds how long a client command (tap, dlq) tries to
// connect: a NATS that accepts TCP but never answers must not keep an
// operator waiting for --timeout.
const cliConnectTimeout = 4 * time.Second

// connectCLI connects a client command to ncfg's NATS within
// min(timeout, cliConnectTimeout); the error names the server and the fix.
func connectCLI(ctx context.Context, ncfg transport.Config, name string, timeout time.Duration, log *slog.Logger) (*nats.Conn, error) {
	within := min(timeout, cliConnectTimeout)
	cctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	nc, err := transport.Connect(cctx, ncfg, name, log)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		return nil, fmt.Errorf("%w: no NATS server answered within %s; check that nats.url (or --nats-url) names a running NATS server's client port (4222 by default; not its monitoring, cluster or a proxy's port), that the server is not overloaded, and, if it expects TLS, the nats.tls settings", err, within)
	}
	return nc, err
}

// indent formats a multi-line error as a list.
func indent(err error) string {
	var b strings.Builder
	for _, line := range strings.Split(err.Error(), "\n") {
		b.WriteString("  - " + line + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
