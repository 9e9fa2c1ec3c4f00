package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/enrich/provider"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/inventory"
)

func init() { register(newValidateCmd) }

func newValidateCmd() *cobra.Command {
	var invPath string
	cmd := &cobra.Command{
		Use:   "validate [FILE] [--inventory FILE]",
		Short: "check a config file (and an inventory file) and list every problem",
		Long: `Check a config file without running anything. Lists every bad field with its
path and the fix; exit code 2 when there is any. ${NAME} references are
expanded from the environment as at start-up; their values are never shown.
URLs are checked (nats.url, collector.s3.endpoint, inventory.openstack.noauth.*)
and, with inventory.provider: openstack, the credentials start-up would use
are resolved (clouds.yaml entry or OS_* variables of this environment,
auth_url included) without contacting Keystone.

A valid config also gets, per stream, the rate it carries with files that
roll by collector.roll_age: collector.early_commit_share × the stream's
max_bytes over roll_age (and × collector.max_ack_pending in agent batches);
above it collectors commit early (smaller files, no publish refused).

--inventory checks a static inventory file (the format of docs/inventory.md
and of tapflow inventory dump) with the loader of inventory.provider: file;
without --inventory, the inventory.file a config with that provider names
is checked. Every collection, object and field that does not parse is
listed (exit 2). Objects the attribution index cannot use (duplicate MACs,
unknown networks, bad CIDRs, …) are listed as warnings: the file loads,
but those objects are skipped or resolved by a safe rule.`,
		Example: `  tapflow validate /etc/tapflow/tapflow.yaml
  tapflow validate --inventory /etc/tapflow/inventory.yaml
  tapflow validate /etc/tapflow/tapflow.yaml --inventory /etc/tapflow/inventory.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 || (len(args) == 0 && invPath == "") {
				return usageHint("give one config file, --inventory FILE, or both")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			code := exitOK
			if len(args) == 1 {
				cfg, err := config.Load(args[0])
				if err == nil {
					// What start-up would read: clouds.yaml or OS_*.
					err = provider.Check(cfg.Inventory)
				}
				if err != nil {
					fmt.Fprintf(stderr, "%s: invalid:\n%s\n", args[0], indent(err))
					code = exitUsage
				} else {
					fmt.Fprintf(stdout, "%s: ok\n", args[0])
					for _, r := range cfg.StreamRates() {
						fmt.Fprintf(stdout, "%s: %s\n", args[0], r)
					}
					if invPath == "" {
						invPath = provider.FilePath(cfg.Inventory) // the file the agent would load
					}
				}
			}
			if invPath != "" && !validateInventory(invPath, stdout, stderr) {
				code = exitUsage
			}
			return exitCode(code)
		},
	}
	cmd.Flags().StringVar(&invPath, "inventory", "", "also check this static inventory `FILE` (docs/inventory.md)")
	return cmd
}

// validateInventory loads path as inventory.provider: file does and builds
// the attribution index from it, as the agent would.
func validateInventory(path string, stdout, stderr io.Writer) bool {
	inv, err := inventory.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "%s: invalid:\n%s\n", path, indent(err))
		return false
	}
	snap := snapshot.Build(inv, snapshot.Options{})
	for _, a := range snap.Anomalies() {
		fmt.Fprintf(stdout, "%s: warning: %s\n", path, a)
	}
	st := snap.Stats()
	fmt.Fprintf(stdout, "%s: ok: %d projects, %d networks, %d subnets, %d ports, %d servers, %d load balancers; %d VM MACs attributed to %d tenants, %d warnings\n",
		path, len(inv.Projects), len(inv.Networks), len(inv.Subnets), len(inv.Ports), len(inv.Servers), len(inv.LoadBalancers),
		st.Endpoints, st.Tenants, len(snap.Anomalies()))
	return true
}
