package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tapflow/tapflow/enrich/inventory"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
)

const inventoryUsage = `Usage:
  tapflow inventory dump --config FILE      print what the provider sees, in the file format
  tapflow inventory confirm --config FILE   apply an inventory the drop guard holds back
  tapflow inventory serve --config FILE     metadata service: read the cloud once, publish snapshots to NATS
`

// inventoryCmd implements `tapflow inventory dump|confirm`.
func inventoryCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "dump":
			return inventoryDump(args, stdout, stderr)
		case "confirm":
			return inventoryConfirm(args[1:], stdout, stderr)
		case "serve":
			return inventoryServe(args[1:], stderr)
		}
	}
	fmt.Fprint(stderr, inventoryUsage)
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
		return exitOK
	}
	return exitUsage
}

func inventoryServe(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow inventory serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file: inventory.* chooses the provider (openstack or file), nats.* the bus (required)")
	duration := fs.Duration("duration", 0, "stop after this long (0 = until SIGINT/SIGTERM)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: tapflow inventory serve --config FILE

The metadata service: one poller per cloud. Reads the cloud through
inventory.provider (openstack: every inventory.refresh; file: on change),
holds back an inventory that lost more than inventory.max_drop_fraction of
the ports, and publishes each new one as a versioned snapshot to NATS
JetStream (Object Store TAPFLOW_INVENTORY). Agents with
inventory.provider: nats need NATS credentials only. Run several for high
availability: one holds the lease (inventory.serve.lease) and publishes,
the others stand by. docs/inventory-service.md.

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
	if *cfgPath == "" {
		fs.Usage()
		return exitUsage
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow inventory serve: invalid config:\n%s", indent(err))
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
	if err := app.RunInventoryServe(ctx, cfg, log); err != nil {
		fmt.Fprintf(stderr, "tapflow inventory serve: %v\n", err)
		return exitRuntime
	}
	return exitOK
}

// inventoryConfirm asks the running process on this host (its metrics
// endpoint, loopback by default) to apply a held inventory.
func inventoryConfirm(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow inventory confirm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file of the running agent (its metrics.listen is asked; required)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: tapflow inventory confirm --config FILE

An inventory that lost more than inventory.max_drop_fraction of the ports is
held back (tapflow_inventory_held is 1, the log says why) until
inventory.drop_confirm_reads reads show the same drop. When the cloud really
shrank, this applies it now: it POSTs /-/inventory/confirm to the process
whose metrics.listen the config names.

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
	if *cfgPath == "" {
		fs.Usage()
		return exitUsage
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow inventory confirm: invalid config:\n%s", indent(err))
		return exitUsage
	}
	if cfg.Metrics.Listen == "" {
		fmt.Fprint(stderr, "tapflow inventory confirm: metrics.listen is empty in the config; the running process has no endpoint to ask\n")
		return exitUsage
	}
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Post("http://"+cfg.Metrics.Listen+"/-/inventory/confirm", "text/plain", nil)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow inventory confirm: %v (is the agent running with metrics.listen %s?)\n", err, cfg.Metrics.Listen)
		return exitRuntime
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "tapflow inventory confirm: %s: %s", resp.Status, body)
		return exitRuntime
	}
	_, _ = stdout.Write(body)
	return exitOK
}

func inventoryDump(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapflow inventory dump", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file whose inventory section names the provider (required)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: tapflow inventory dump --config FILE

Print the inventory the configured provider sees (inventory.provider: openstack
reads Keystone, Neutron, Nova and Octavia once; file re-reads the file) in the
static inventory file format (docs/inventory.md), so it can be inspected or
replayed with inventory.provider: file. Secrets are never printed.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *cfgPath == "" {
		fs.Usage()
		return exitUsage
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow inventory dump: invalid config:\n%s", indent(err))
		return exitUsage
	}
	log := obs.NewLogger(stderr, cfg.Log.Format, cfg.Log.Level)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cfg.Inventory.Provider {
	case "openstack":
		err = openstack.Dump(ctx, cfg.Inventory.OpenStackConfig(), log, stdout)
	case "file":
		var inv *inventory.Inventory
		if inv, err = inventory.Load(cfg.Inventory.File); err == nil {
			err = openstack.WriteInventory(stdout, inv)
		}
	default:
		err = fmt.Errorf("inventory.provider %q cannot be dumped", cfg.Inventory.Provider)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tapflow inventory dump: %v\n", err)
		return exitRuntime
	}
	return exitOK
}
