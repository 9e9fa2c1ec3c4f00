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

	"github.com/tapflow/tapflow/enrich/inventory"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
)

// inventoryCmd implements `tapflow inventory dump`.
func inventoryCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "dump" {
		fmt.Fprint(stderr, "Usage: tapflow inventory dump --config FILE\n")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return exitOK
		}
		return exitUsage
	}
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
