package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/lab"
)

const labUsage = `tapflow lab — a mini OpenStack cloud in network namespaces, on real traffic

Usage:
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
topology and scenario formats, the endpoint names and a walk-through.
`

func labCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, labUsage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve", "send": // hidden: run inside namespaces by the lab
		return lab.HelperMain(args, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, labUsage)
		return exitOK
	}
	fs := flag.NewFlagSet("tapflow lab "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("prefix", "tfl", "namespace prefix of the lab (a lowercase letter, then up to 11 letters or digits)")
	state := fs.String("state", "", "state directory (default /run/tapflow-lab/<prefix>)")
	verbose := fs.Bool("v", false, "log every command the lab runs")
	fs.Usage = func() { fmt.Fprintf(stderr, "%s\nFlags of %s:\n", labUsage, cmd); fs.PrintDefaults() }

	// per-command flags
	var (
		register  = new(string)
		novaConf  = new(string)
		all       = new(bool)
		data      = new(string)
		duration  = new(time.Duration)
		keep      = new(bool)
		tr        lab.Transfer
		bytesFlag = new(string)
		durFlag   = new(time.Duration)
	)
	switch cmd {
	case "up", "scenario":
		register = fs.String("register", "", "Keystone v3 URL: create the cloud's objects in that OpenStack (admin credentials from OS_*); lab down deletes them")
		novaConf = fs.String("nova-conf", "", "with --register on deploy/openstack-testbed: its nova.conf, to create the Nova servers (its nova-api cannot boot)")
	}
	switch cmd {
	case "down":
		all = fs.Bool("all", false, "remove every lab (every namespace set with a <prefix>-hv)")
	case "run":
		data = fs.String("data", "lab-data/run", "tapflow data directory (Parquet under <data>/flows)")
		duration = fs.Duration("duration", 0, "stop after this long (0: until SIGINT/SIGTERM)")
	case "scenario":
		data = fs.String("data", "lab-data", "directory for each scenario's tapflow data (<data>/<scenario>)")
		keep = fs.Bool("keep", false, "leave the lab up after the scenario (then: tapflow lab down)")
	case "drive":
		fs.StringVar(&tr.From, "from", "", "sender: a server name, or internet")
		fs.StringVar(&tr.To, "to", "", "destination: SERVER[/v6], fip:NAME, lb:NAME, internet[:N], metadata, gateway:NET, dhcp:NET, mcast:GROUP, ip:ADDR")
		fs.StringVar(&tr.Proto, "proto", "", "tcp (default), udp, http or icmp (default: what the destination implies)")
		bytesFlag = fs.String("bytes", "1MiB", "payload bytes")
		fs.IntVar(&tr.Port, "port", 0, "destination port (default: the service's)")
		fs.BoolVar(&tr.Download, "download", false, "tcp/http: the destination sends")
		fs.IntVar(&tr.Size, "size", 0, "udp datagram / icmp payload size (default 1000)")
		durFlag = fs.Duration("duration", 0, "spread the payload over this long")
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "tapflow lab: cannot find my own executable: %v\n", err)
		return exitRuntime
	}
	opts := lab.Options{Prefix: *prefix, StateDir: *state, Helper: lab.Command{Path: exe, Args: []string{"lab"}}, Logger: log}
	if *register != "" {
		opts.Register = &lab.RegisterOptions{AuthURL: *register, NovaConf: *novaConf}
	} else if *novaConf != "" {
		fmt.Fprintln(stderr, "tapflow lab: --nova-conf needs --register")
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "tapflow lab %s: %v\n", cmd, err)
		return exitRuntime
	}

	switch cmd {
	case "up":
		if fs.NArg() != 1 {
			fmt.Fprintln(stderr, "tapflow lab up: give one topology (a file, or a built-in name; see tapflow lab list)")
			return exitUsage
		}
		data, name, err := readTopology(fs.Arg(0))
		if err != nil {
			return fail(err)
		}
		l, err := lab.New(data, name, opts)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitUsage
		}
		start := time.Now()
		if err := l.Up(ctx); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "lab %s is up in %s: %d namespaces, %d taps in %s\n",
			l.Prefix(), time.Since(start).Round(time.Millisecond), len(l.Cloud.Namespaces()), len(l.Cloud.Taps()), l.Cloud.HVNS())
		if l.Registered() {
			fmt.Fprintf(stdout, "registered in OpenStack at %s; tapflow reads it with %s (entry lab)\n", *register, l.CloudsPath())
		} else {
			fmt.Fprintf(stdout, "inventory: %s\n", l.InventoryPath())
		}
		fmt.Fprintf(stdout, "next: tapflow lab run --prefix %s --data lab-data/run   (another terminal), then tapflow lab drive ...\n", l.Prefix())
		return exitOK
	case "down":
		prefixes := []string{*prefix}
		if *all {
			if prefixes, err = lab.Labs(); err != nil {
				return fail(err)
			}
		}
		for _, p := range prefixes {
			dir := *state
			if *all {
				dir = ""
			}
			names, err := lab.Teardown(ctx, p, dir, log)
			if err != nil {
				return fail(err)
			}
			fmt.Fprintf(stdout, "lab %s: removed %d namespaces\n", p, len(names))
		}
		return exitOK
	case "list":
		return labList(stdout, stderr)
	case "scenario":
		return labScenarios(ctx, fs.Args(), *data, *keep, opts, exe, stdout, stderr)
	}

	// The rest act on a running lab.
	l, err := lab.Open(opts)
	if err != nil {
		return fail(err)
	}
	switch cmd {
	case "run":
		p, err := l.StartPipeline(ctx, lab.PipelineOptions{Command: lab.Command{Path: exe}, DataDir: *data})
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "tapflow run in %s: every tap attached; log %s; Ctrl-C stops it gracefully\n", l.Cloud.HVNS(), p.LogPath())
		if *duration > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(*duration):
			}
		} else {
			<-ctx.Done()
		}
		err = p.Stop(context.Background())
		p.Close()
		if err != nil {
			return fail(err)
		}
		flows, err := lab.ReadFlows(p.DataDir())
		if err != nil {
			return fail(err)
		}
		lab.PrintTable(stdout, l.Cloud.Table(flows))
		cons, err := lab.RunConservation(flows, p.DataDir(), p.LogPath())
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "conservation: %s\nParquet: %s/flows/dt=*/hour=*/*.parquet\n", cons, p.DataDir())
		return exitOK
	case "drive":
		n, err := units.ParseByteSize(*bytesFlag)
		if err != nil {
			fmt.Fprintln(stderr, "tapflow lab drive: --bytes:", err)
			return exitUsage
		}
		tr.Bytes, tr.Duration = n, units.Duration(*durFlag)
		if tr.From == "" || tr.To == "" {
			fmt.Fprintln(stderr, "tapflow lab drive: --from and --to are required")
			return exitUsage
		}
		res, err := l.Drive(ctx, []lab.Transfer{tr})
		if err != nil {
			return fail(err)
		}
		for _, r := range res {
			fmt.Fprintf(stdout, "%s %s: %d payload bytes confirmed in %.2fs\n", r.Proto, r.To, r.Bytes, r.Seconds)
		}
		return exitOK
	case "failover":
		if fs.NArg() != 1 {
			fmt.Fprintln(stderr, "tapflow lab failover: give the load balancer's name")
			return exitUsage
		}
		from, to, err := l.Failover(ctx, fs.Arg(0))
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "VIP of %s moved from %s to %s\n", fs.Arg(0), from.Name, to.Name)
		return exitOK
	case "inventory":
		if fs.NArg() != 2 || (fs.Arg(0) != "add" && fs.Arg(0) != "remove") {
			fmt.Fprintln(stderr, "tapflow lab inventory: add|remove SERVER")
			return exitUsage
		}
		if err := l.SetPresent(fs.Arg(1), fs.Arg(0) == "add"); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "inventory %s: %s %s\n", l.InventoryPath(), fs.Arg(0), fs.Arg(1))
		return exitOK
	}
	fmt.Fprintf(stderr, "tapflow lab: unknown command %q\n\n%s", cmd, labUsage)
	return exitUsage
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
