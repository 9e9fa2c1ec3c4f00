package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/config"
)

func init() { register(newCaptureCmd) }

func newCaptureCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "capture status|detach",
		Short: "show or remove the capture state pinned in bpffs (capture.pin_dir)",
		Long: `The eBPF capture state an agent leaves pinned in capture.pin_dir (tcx links,
flow table, ring buffer) so that its next start adopts it and loses nothing:
every stop exports the flows, so the table holds what the programs counted
since (or everything, after a SIGKILL).`,
	}, newCaptureSubCmd("status", `Show what is pinned in capture.pin_dir: tcx links, flows still in the
kernel table (not yet exported), ring-buffer bytes not yet durable.`),
		newCaptureSubCmd("detach", `Remove the pinned state: detach the programs from every tap (tcx links and
tapflow_* cls_bpf filters) and delete the pinned maps. What they still hold
is discarded (the command says how much): to export it first, run the agent
once with --detach instead (docs/operations.md).`))
}

func newCaptureSubCmd(sub, long string) *cobra.Command {
	var cfgPath, pinDir string
	cmd := &cobra.Command{
		Use:   sub + " [--config FILE] [--pin-dir DIR]",
		Short: map[string]string{"status": "show the pinned capture state", "detach": "remove the pinned capture state (uninstall)"}[sub],
		Long:  long,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cfgPath, func(c *config.Config) { set(&c.Capture.PinDir, pinDir) })
			if err != nil {
				return usageErr("invalid config:\n%s", indent(err))
			}
			dir := cfg.Capture.PinDir
			if dir == "" {
				return usageErr("capture.pin_dir is empty (pinning disabled): nothing is pinned")
			}
			if !filepath.IsAbs(dir) {
				return usageErr("capture.pin_dir %q is not an absolute path: give the bpffs directory the agent uses, e.g. /sys/fs/bpf/tapflow", dir)
			}
			s, err := bpf.Summarize(dir)
			if err != nil {
				return err
			}
			stdout := cmd.OutOrStdout()
			fmt.Fprintf(stdout, "pin_dir %s: versions %v (this one %s), %d tcx links, %d flows holding %d bytes / %d packets not yet exported, %d ring-buffer bytes not yet durable\n",
				dir, s.ABIs, bpf.ABI, s.Links, s.Flows, s.Bytes, s.Packets, s.RingUnread)
			if sub == "status" {
				return nil
			}
			removed, err := bpf.RemovePinned(dir)
			filters := 0
			if links, lerr := netlink.LinkList(); lerr == nil {
				for _, l := range links {
					n, ferr := attach.RemoveStale(l.Attrs().Index)
					filters += n
					err = errors.Join(err, ferr)
				}
			} else {
				err = errors.Join(err, fmt.Errorf("list interfaces: %w", lerr))
			}
			fmt.Fprintf(stdout, "removed %d pinned objects and %d cls_bpf filters; discarded %d flows (%d bytes) and %d ring-buffer bytes\n",
				len(removed), filters, s.Flows, s.Bytes, s.RingUnread)
			return err
		},
	}
	cmd.Flags().StringVar(&cfgPath, "config", "", "config `FILE`: its capture.pin_dir is used")
	cmd.Flags().StringVar(&pinDir, "pin-dir", "", "override capture.pin_dir with `DIR`")
	return cmd
}
