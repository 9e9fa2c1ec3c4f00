package main

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/internal/app"
)

func init() { register(newInventoryCmd) }

func newInventoryCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "inventory dump|confirm|serve",
		Short: "print what the provider sees, apply a held drop, run the metadata service",
		Long: `The attribution inventory: the ports, networks, servers and load balancers
of the cloud (docs/inventory.md).`,
	}, newInventoryDumpCmd(), newInventoryConfirmCmd(), newInventoryServeCmd())
}

// inventoryCmd is an inventory subcommand: --config FILE (configUsage
// says what of it the command reads) is required, run gets the command
// and its flags once they are parsed.
func inventoryCmd(use, short, long, configUsage string, cf *cfgFlags, run func(cmd *cobra.Command) error) *cobra.Command {
	cf.required = true
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return run(cmd) },
	}
	cf.bindConfig(cmd.Flags(), configUsage)
	return cmd
}

func newInventoryServeCmd() *cobra.Command {
	var (
		cf       cfgFlags
		duration time.Duration
	)
	cmd := inventoryCmd("serve --config FILE", "metadata service: read the cloud once, publish snapshots to NATS",
		`The metadata service: one poller per cloud. Reads the cloud through
inventory.provider (openstack: every inventory.refresh; file: on change),
holds back an inventory that lost more than inventory.max_drop_fraction of
the ports, and publishes each new one as a versioned snapshot to NATS
JetStream (Object Store TAPFLOW_INVENTORY). Agents with
inventory.provider: nats need NATS credentials only. Run several for high
availability: one holds the lease (inventory.serve.lease) and publishes,
the others stand by. With inventory.scope: node it publishes a shared view
(no names, placement or other nodes' ids) and each node's overlay
(stream TAPFLOW_INVENTORY_NODES), pseudonyms keyed by
inventory.serve.key_file: an agent learns less of other tenants
(docs/security.md, What an agent sees). docs/inventory-service.md.`,
		"read the config from `FILE`: inventory.* chooses the provider (openstack or file), nats.* the bus (required)",
		&cf, func(cmd *cobra.Command) error {
			holdHangups()
			ctx, cfg, log, stop, err := cf.loadRun(cmd, duration)
			if err != nil {
				return err
			}
			defer stop()
			return app.RunInventoryServe(ctx, cfg, log)
		})
	cf.bindObs(cmd.Flags(), true)
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long (0 = until SIGINT/SIGTERM)")
	return cmd
}

// newInventoryConfirmCmd asks the running process on this host (its
// metrics endpoint, loopback by default) to apply a held inventory.
func newInventoryConfirmCmd() *cobra.Command {
	var cf cfgFlags
	return inventoryCmd("confirm --config FILE", "apply an inventory the drop guard holds back",
		`An inventory that lost more than inventory.max_drop_fraction of the ports is
held back (tapflow_inventory_held is 1, the log says why) until
inventory.drop_confirm_reads reads show the same drop. When the cloud really
shrank, this applies it now: it POSTs /-/inventory/confirm to the process
whose metrics.listen the config names.`,
		"the config `FILE` of the running agent (its metrics.listen is asked; required)",
		&cf, func(cmd *cobra.Command) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			if cfg.Metrics.Listen == "" {
				return usageErr("metrics.listen is empty in the config; the running process has no endpoint to ask")
			}
			cl := &http.Client{Timeout: 10 * time.Second}
			resp, err := cl.Post("http://"+cfg.Metrics.Listen+"/-/inventory/confirm", "text/plain", nil)
			if err != nil {
				return fmt.Errorf("%w (is the agent running with metrics.listen %s?)", err, cfg.Metrics.Listen)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", resp.Status, body)
			}
			_, err = cmd.OutOrStdout().Write(body)
			return err
		})
}

func newInventoryDumpCmd() *cobra.Command {
	var cf cfgFlags
	cmd := inventoryCmd("dump --config FILE", "print what the provider sees, in the file format",
		`Print the inventory the configured provider sees (inventory.provider: openstack
reads Keystone, Neutron, Nova and Octavia once; file re-reads the file) in the
static inventory file format (docs/inventory.md), so it can be inspected or
replayed with inventory.provider: file. Secrets are never printed.`,
		"the config `FILE` whose inventory section names the provider (required)",
		&cf, func(cmd *cobra.Command) error {
			ctx, cfg, log, stop, err := cf.loadRun(cmd, 0)
			if err != nil {
				return err
			}
			defer stop()
			return provider.Dump(ctx, cfg.Inventory, log, cmd.OutOrStdout())
		})
	cf.bindObs(cmd.Flags(), false)
	return cmd
}
