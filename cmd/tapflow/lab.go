package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/lab"
)

const labLong = `tapflow lab — a mini OpenStack cloud in network namespaces, on real traffic

  tapflow lab up [--prefix P] TOPOLOGY     build the cloud (a file, or a built-in name: demo, …)
  tapflow lab up --register KEYSTONE_URL [--nova-conf FILE] TOPOLOGY
                                          create the same objects in a real OpenStack first
                                          (credentials: OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME,
                                          …), build the namespaces with the ids, MACs and
                                          addresses it made; tapflow then reads the APIs
  tapflow lab down [--prefix P | --all]    remove it (also after a crash: by namespace prefix)
  tapflow lab run [--prefix P] --data DIR  run tapflow (source ebpf) on the lab's taps until Ctrl-C
  tapflow lab drive [--prefix P] --from A --to B [--proto tcp|udp|http|icmp] [--bytes 4MiB] ...
  tapflow lab failover [--prefix P] LB     stop the MASTER amphora's keepalived; the VIP moves
  tapflow lab inventory [--prefix P] add|remove SERVER
                                          put a server's ports into / out of the inventory file
  tapflow lab scenario [--data DIR] [--register URL] NAME|FILE|all ...
                                          run acceptance scenarios: up, tapflow run, drive,
                                          stop, check the Parquet table and conservation, down
  tapflow lab list                        built-in topologies and scenarios, and running labs

Needs root and the Debian packages iproute2, nftables, haproxy, keepalived.
Everything lives in namespaces named <prefix>-… (default prefix tfl); the
host's own interfaces and routes are never touched. docs/lab.md has the
topology and scenario formats, the endpoint names and a walk-through.`

func init() { register(newLabCmd) }

// labFlags are the flags every lab command has.
type labFlags struct {
	prefix, state      string
	verbose            bool
	register, novaConf string // up and scenario only
}

// labEnv is what a lab command runs with.
type labEnv struct {
	ctx  context.Context
	log  *slog.Logger
	exe  string
	opts lab.Options
}

func (lf *labFlags) env(cmd *cobra.Command) (*labEnv, context.CancelFunc, error) {
	level := slog.LevelInfo
	if lf.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("cannot find my own executable: %w", err)
	}
	opts := lab.Options{Prefix: lf.prefix, StateDir: lf.state, Helper: lab.Command{Path: exe, Args: []string{"lab"}}, Logger: log}
	if lf.register != "" {
		opts.Register = &lab.RegisterOptions{AuthURL: lf.register, NovaConf: lf.novaConf}
	} else if lf.novaConf != "" {
		return nil, nil, usageErr("--nova-conf needs --register")
	}
	ctx, stop := signalContext()
	return &labEnv{ctx: ctx, log: log, exe: exe, opts: opts}, stop, nil
}

// labCommand builds a lab subcommand whose RunE gets the lab environment.
func labCommand(lf *labFlags, c *cobra.Command, fn func(e *labEnv, cmd *cobra.Command, args []string) error) *cobra.Command {
	c.RunE = func(cmd *cobra.Command, args []string) error {
		e, stop, err := lf.env(cmd)
		if err != nil {
			return err
		}
		defer stop()
		return fn(e, cmd, args)
	}
	return c
}

func (lf *labFlags) bindRegister(c *cobra.Command) {
	c.Flags().StringVar(&lf.register, "register", "", "Keystone v3 URL: create the cloud's objects in that OpenStack (admin credentials from OS_*); lab down deletes them")
	c.Flags().StringVar(&lf.novaConf, "nova-conf", "", "with --register on deploy/openstack-testbed: its nova.conf, to create the Nova servers (its nova-api cannot boot)")
}

func newLabCmd() *cobra.Command {
	lf := &labFlags{}
	root := &cobra.Command{
		Use:   "lab <command>",
		Short: "a mini OpenStack cloud in network namespaces: up, down, run, drive, scenario (docs/lab.md)",
		Long:  labLong,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&lf.prefix, "prefix", "tfl", "namespace prefix of the lab (a lowercase letter, then up to 11 letters or digits)")
	pf.StringVar(&lf.state, "state", "", "state directory (default /run/tapflow-lab/<prefix>)")
	pf.BoolVarP(&lf.verbose, "verbose", "v", false, "log every command the lab runs")

	up := labCommand(lf, &cobra.Command{
		Use: "up [--register KEYSTONE_URL] TOPOLOGY", Short: "build the cloud (a file, or a built-in name: demo, …)",
		Long: "Build the cloud of TOPOLOGY (a file, or a built-in name; see tapflow lab list). With --register,\ncreate the same objects in a real OpenStack first (credentials: OS_USERNAME, OS_PASSWORD,\nOS_PROJECT_NAME, …) and build the namespaces with the ids, MACs and addresses it made.",
		Args: exactArgs(1, "one topology (a file, or a built-in name; see tapflow lab list)"),
	}, func(e *labEnv, cmd *cobra.Command, args []string) error {
		data, name, err := readTopology(args[0])
		if err != nil {
			return err
		}
		l, err := lab.New(data, name, e.opts)
		if err != nil {
			return usageErr("%v", err)
		}
		start := time.Now()
		if err := l.Up(e.ctx); err != nil {
			return err
		}
		stdout := cmd.OutOrStdout()
		fmt.Fprintf(stdout, "lab %s is up in %s: %d namespaces, %d taps in %s\n",
			l.Prefix(), time.Since(start).Round(time.Millisecond), len(l.Cloud.Namespaces()), len(l.Cloud.Taps()), l.Cloud.HVNS())
		if l.Registered() {
			fmt.Fprintf(stdout, "registered in OpenStack at %s; tapflow reads it with %s (entry lab)\n", lf.register, l.CloudsPath())
		} else {
			fmt.Fprintf(stdout, "inventory: %s\n", l.InventoryPath())
		}
		fmt.Fprintf(stdout, "next: tapflow lab run --prefix %s --data lab-data/run   (another terminal), then tapflow lab drive ...\n", l.Prefix())
		return nil
	})
	lf.bindRegister(up)

	var all bool
	down := labCommand(lf, &cobra.Command{
		Use: "down [--prefix P | --all]", Short: "remove it (also after a crash: by namespace prefix)",
		Long: "Remove the lab's namespaces (also after a crash: by namespace prefix) and, for a registered lab, its OpenStack objects.",
		Args: noArgs,
	}, func(e *labEnv, cmd *cobra.Command, _ []string) error {
		prefixes := []string{lf.prefix}
		if all {
			var err error
			if prefixes, err = lab.Labs(); err != nil {
				return err
			}
		}
		for _, p := range prefixes {
			dir := lf.state
			if all {
				dir = ""
			}
			names, err := lab.Teardown(e.ctx, p, dir, e.log)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s: removed %d namespaces\n", p, len(names))
		}
		return nil
	})
	down.Flags().BoolVar(&all, "all", false, "remove every lab (every namespace set with a <prefix>-hv)")

	list := &cobra.Command{
		Use: "list", Short: "built-in topologies and scenarios, and running labs",
		Long: "List the built-in topologies and scenarios, and the running labs.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return exitCode(labList(cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}

	var scData string
	var keep bool
	scenario := labCommand(lf, &cobra.Command{
		Use: "scenario [--data DIR] [--register URL] NAME|FILE|all ...", Short: "run acceptance scenarios: up, tapflow run, drive, stop, check, down",
		Long: "Run acceptance scenarios: up, tapflow run, drive, stop, check the Parquet table and conservation, down.",
		Args: cobra.ArbitraryArgs,
	}, func(e *labEnv, cmd *cobra.Command, args []string) error {
		return exitCode(labScenarios(e.ctx, args, scData, keep, e.opts, e.exe, cmd.OutOrStdout(), cmd.ErrOrStderr()))
	})
	scenario.Flags().StringVar(&scData, "data", "lab-data", "directory for each scenario's tapflow data (<data>/<scenario>)")
	scenario.Flags().BoolVar(&keep, "keep", false, "leave the lab up after the scenario (then: tapflow lab down)")
	lf.bindRegister(scenario)

	var runData string
	var runDuration time.Duration
	runCmd := labCommand(lf, &cobra.Command{
		Use: "run [--prefix P] --data DIR", Short: "run tapflow (source ebpf) on the lab's taps until Ctrl-C",
		Long: "Run tapflow (source ebpf) on the lab's taps until Ctrl-C, then print the flow table and the conservation check.",
		Args: noArgs,
	}, func(e *labEnv, cmd *cobra.Command, _ []string) error {
		l, err := lab.Open(e.opts)
		if err != nil {
			return err
		}
		p, err := l.StartPipeline(e.ctx, lab.PipelineOptions{Command: lab.Command{Path: e.exe}, DataDir: runData})
		if err != nil {
			return err
		}
		stdout := cmd.OutOrStdout()
		fmt.Fprintf(stdout, "tapflow run in %s: every tap attached; log %s; Ctrl-C stops it gracefully\n", l.Cloud.HVNS(), p.LogPath())
		if runDuration > 0 {
			select {
			case <-e.ctx.Done():
			case <-time.After(runDuration):
			}
		} else {
			<-e.ctx.Done()
		}
		err = p.Stop(context.Background())
		p.Close()
		if err != nil {
			return err
		}
		flows, err := lab.ReadFlows(p.DataDir())
		if err != nil {
			return err
		}
		lab.PrintTable(stdout, l.Cloud.Table(flows))
		cons, err := lab.RunConservation(flows, p.DataDir(), p.LogPath())
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "conservation: %s\nParquet: %s/flows/dt=*/hour=*/*.parquet\n", cons, p.DataDir())
		return nil
	})
	runCmd.Flags().StringVar(&runData, "data", "lab-data/run", "tapflow data directory (Parquet under <data>/flows)")
	runCmd.Flags().DurationVar(&runDuration, "duration", 0, "stop after this long (0: until SIGINT/SIGTERM)")

	var tr lab.Transfer
	var bytesFlag string
	var durFlag time.Duration
	drive := labCommand(lf, &cobra.Command{
		Use: "drive --from A --to B [flags]", Short: "send traffic between lab endpoints and confirm it arrived",
		Long: "Send traffic from one lab endpoint to another and confirm the payload arrived.",
		Args: noArgs,
	}, func(e *labEnv, cmd *cobra.Command, _ []string) error {
		n, err := units.ParseByteSize(bytesFlag)
		if err != nil {
			return usageErr("--bytes: %v", err)
		}
		tr.Bytes, tr.Duration = n, units.Duration(durFlag)
		if tr.From == "" || tr.To == "" {
			return usageHint("--from and --to are required")
		}
		l, err := lab.Open(e.opts)
		if err != nil {
			return err
		}
		res, err := l.Drive(e.ctx, []lab.Transfer{tr})
		if err != nil {
			return err
		}
		for _, r := range res {
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %d payload bytes confirmed in %.2fs\n", r.Proto, r.To, r.Bytes, r.Seconds)
		}
		return nil
	})
	df := drive.Flags()
	df.StringVar(&tr.From, "from", "", "sender: a server name, or internet")
	df.StringVar(&tr.To, "to", "", "destination: SERVER[/v6], fip:NAME, lb:NAME, internet[:N], metadata, gateway:NET, dhcp:NET, mcast:GROUP, ip:ADDR")
	df.StringVar(&tr.Proto, "proto", "", "tcp (default), udp, http or icmp (default: what the destination implies)")
	df.StringVar(&bytesFlag, "bytes", "1MiB", "payload bytes")
	df.IntVar(&tr.Port, "port", 0, "destination port (default: the service's)")
	df.BoolVar(&tr.Download, "download", false, "tcp/http: the destination sends")
	df.IntVar(&tr.Size, "size", 0, "udp datagram / icmp payload size (default 1000)")
	df.DurationVar(&durFlag, "duration", 0, "spread the payload over this long")

	failover := labCommand(lf, &cobra.Command{
		Use: "failover LB", Short: "stop the MASTER amphora's keepalived; the VIP moves",
		Long: "Stop the keepalived of load balancer LB's MASTER amphora; the VIP moves to the BACKUP.",
		Args: exactArgs(1, "the load balancer's name"),
	}, func(e *labEnv, cmd *cobra.Command, args []string) error {
		l, err := lab.Open(e.opts)
		if err != nil {
			return err
		}
		from, to, err := l.Failover(e.ctx, args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "VIP of %s moved from %s to %s\n", args[0], from.Name, to.Name)
		return nil
	})

	inv := labCommand(lf, &cobra.Command{
		Use: "inventory add|remove SERVER", Short: "put a server's ports into / out of the inventory file",
		Long: "Put a server's ports into (add) or out of (remove) the lab's inventory file.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 || (args[0] != "add" && args[0] != "remove") {
				return usageHint("give add|remove SERVER")
			}
			return nil
		},
	}, func(e *labEnv, cmd *cobra.Command, args []string) error {
		l, err := lab.Open(e.opts)
		if err != nil {
			return err
		}
		if err := l.SetPresent(args[1], args[0] == "add"); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "inventory %s: %s %s\n", l.InventoryPath(), args[0], args[1])
		return nil
	})

	// Hidden: the traffic helpers the lab runs inside its namespaces, with
	// their own flags (lab.HelperMain parses them).
	helper := func(name string) *cobra.Command {
		return &cobra.Command{
			Use: name, Hidden: true, DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				return exitCode(lab.HelperMain(append([]string{name}, args...), cmd.OutOrStdout(), cmd.ErrOrStderr()))
			},
		}
	}
	return group(root, up, down, runCmd, drive, failover, inv, scenario, list, helper("serve"), helper("send"))
}

// readTopology reads a topology file, or a built-in one by name.
func readTopology(arg string) ([]byte, string, error) {
	if b, err := os.ReadFile(arg); err == nil {
		return b, arg, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, "", err
	}
	name := strings.TrimSuffix(arg, ".yaml") + ".yaml"
	b, err := fs.ReadFile(labfiles.FS, name)
	if err != nil {
		return nil, "", fmt.Errorf("topology %q: no such file and no built-in topology of that name (see tapflow lab list)", arg)
	}
	return b, "deploy/lab/" + name, nil
}

func labList(stdout, stderr io.Writer) int {
	tops, _ := fs.Glob(labfiles.FS, "*.yaml")
	fmt.Fprintln(stdout, "built-in topologies (tapflow lab up NAME):")
	for _, t := range tops {
		fmt.Fprintln(stdout, "  "+strings.TrimSuffix(t, ".yaml"))
	}
	names, _ := lab.ListScenarios(labfiles.FS, "scenarios")
	fmt.Fprintln(stdout, "scenarios (tapflow lab scenario NAME):")
	for _, n := range names {
		sc, err := lab.LoadScenario(labfiles.FS, n)
		if err != nil {
			fmt.Fprintf(stdout, "  %-26s INVALID: %v\n", strings.TrimSuffix(filepath.Base(n), ".yaml"), err)
			continue
		}
		fmt.Fprintf(stdout, "  %-26s %s\n", sc.Name, sc.Description)
	}
	labs, err := lab.Labs()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitRuntime
	}
	fmt.Fprintln(stdout, "running labs:")
	if len(labs) == 0 {
		fmt.Fprintln(stdout, "  (none)")
	}
	for _, p := range labs {
		ns, _ := lab.ListNamespaces(p)
		fmt.Fprintf(stdout, "  %-12s %d namespaces\n", p, len(ns))
	}
	return exitOK
}

func labScenarios(ctx context.Context, args []string, data string, keep bool, opts lab.Options, exe string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "tapflow lab scenario: give scenario names, files, or all (see tapflow lab list)")
		return exitUsage
	}
	type item struct {
		fsys fs.FS
		name string
	}
	var items []item
	for _, a := range args {
		switch {
		case a == "all":
			names, _ := lab.ListScenarios(labfiles.FS, "scenarios")
			for _, n := range names {
				if !strings.HasSuffix(n, "/demo.yaml") {
					items = append(items, item{labfiles.FS, n})
				}
			}
		case strings.HasSuffix(a, ".yaml"):
			if _, err := os.Stat(a); err == nil {
				items = append(items, item{os.DirFS(filepath.Dir(a)), filepath.Base(a)})
				continue
			}
			fallthrough
		default:
			items = append(items, item{labfiles.FS, "scenarios/" + strings.TrimSuffix(a, ".yaml") + ".yaml"})
		}
	}
	failed := 0
	start := time.Now()
	for _, it := range items {
		sc, err := lab.LoadScenario(it.fsys, it.name)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitUsage
		}
		out, err := lab.RunScenario(ctx, sc, lab.RunOptions{Prefix: opts.Prefix, StateDir: opts.StateDir, Helper: opts.Helper,
			Tapflow: lab.Command{Path: exe}, DataDir: filepath.Join(data, sc.Name), Keep: keep, Logger: opts.Logger, Register: opts.Register})
		if err != nil {
			fmt.Fprintf(stderr, "scenario %s: %v\n", sc.Name, err)
			failed++
			if ctx.Err() != nil {
				break
			}
			continue
		}
		out.Print(stdout)
		if out.Failed() > 0 {
			failed++
		}
	}
	fmt.Fprintf(stdout, "\n%d scenario(s), %d failed, %s\n", len(items), failed, time.Since(start).Round(time.Second))
	if failed > 0 {
		return exitRuntime
	}
	return exitOK
}
