package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/vishvananda/netlink"
)

const captureUsage = `Usage: tapflow capture status|detach [--config FILE] [--pin-dir DIR]

  status  show what is pinned in capture.pin_dir: tcx links, flows still in the
          kernel table (not yet exported), ring-buffer bytes not yet durable
  detach  remove it: detach the programs from every tap (tcx links and
          tapflow_* cls_bpf filters) and delete the pinned maps. What they
          still hold is discarded (the command says how much): to export it
          first, run the agent once with --detach instead (docs/operations.md).
`

func captureCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "status" && args[0] != "detach") {
		fmt.Fprint(stderr, captureUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return exitOK
		}
		return exitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("tapflow capture "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file: its capture.pin_dir is used")
	pinDir := fs.String("pin-dir", "", "override capture.pin_dir")
	fs.Usage = func() { fmt.Fprint(stderr, captureUsage, "\nFlags:\n"); fs.PrintDefaults() }
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	cfg, err := loadConfig(*cfgPath, func(c *config.Config) { set(&c.Capture.PinDir, *pinDir) })
	if err != nil {
		fmt.Fprintf(stderr, "tapflow capture %s: invalid config:\n%s\n", sub, indent(err))
		return exitUsage
	}
	dir := cfg.Capture.PinDir
	if dir == "" {
		fmt.Fprintf(stderr, "tapflow capture %s: capture.pin_dir is empty (pinning disabled): nothing is pinned\n", sub)
		return exitUsage
	}
	if !filepath.IsAbs(dir) {
		fmt.Fprintf(stderr, "tapflow capture %s: capture.pin_dir %q is not an absolute path: give the bpffs directory the agent uses, e.g. /sys/fs/bpf/tapflow\n", sub, dir)
		return exitUsage
	}
	s, err := bpf.Summarize(dir)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow capture %s: %v\n", sub, err)
		return exitRuntime
	}
	fmt.Fprintf(stdout, "pin_dir %s: versions %v (this one %s), %d tcx links, %d flows holding %d bytes / %d packets not yet exported, %d ring-buffer bytes not yet durable\n",
		dir, s.ABIs, bpf.ABI, s.Links, s.Flows, s.Bytes, s.Packets, s.RingUnread)
	if sub == "status" {
		return exitOK
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
	if err != nil {
		fmt.Fprintf(stderr, "tapflow capture detach: %v\n", err)
		return exitRuntime
	}
	return exitOK
}
