package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/transport/publish/spool"
)

const spoolLong = `Operate on an agent spool directory (agent.spool.dir, default
<data_dir>/agent/spool): the batches an agent keeps on disk while NATS is
unreachable, replayed in order when it answers again.

Exit codes: 0 ok, 1 problems found (verify) or repair failed, 2 usage.`

func init() { register(newSpoolCmd) }

func newSpoolCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:   "spool inspect|verify|repair DIR",
		Short: "inspect, verify or repair an agent spool directory",
		Long:  spoolLong,
	},
		newSpoolOpCmd("inspect", "list segments, batches, records, batch_seq ranges, ages and the replay cursor; read-only, safe while the agent runs", spool.Inspect),
		newSpoolOpCmd("verify", "check every frame's checksum; exit 1 when anything is corrupt", spool.Verify),
		newSpoolOpCmd("repair", "truncate a torn tail, rewrite segments without corrupt stretches, fix the cursor", spool.Repair),
	)
}

func newSpoolOpCmd(op, short string, fn func(dir string) (*spool.Report, error)) *cobra.Command {
	long := short + "."
	if op == "repair" {
		long += `
Refuses while an agent holds the directory. Batches in corrupt stretches are
lost: the report says how much.`
	}
	return &cobra.Command{
		Use:   op + " DIR",
		Short: short,
		Long:  long + "\n\n" + spoolLong,
		Args:  exactArgs(1, "the spool directory (agent.spool.dir)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return exitCode(spoolOp(op, args[0], fn, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
}

// spoolOp runs one operation and prints its report.
func spoolOp(op, dir string, fn func(string) (*spool.Report, error), stdout, stderr io.Writer) int {
	rep, err := fn(dir)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow spool %s: %v\n", op, err)
		if rep != nil {
			printSpoolReport(stdout, rep)
		}
		return exitRuntime
	}
	printSpoolReport(stdout, rep)
	if op == "repair" {
		if len(rep.Repaired) == 0 {
			fmt.Fprintln(stdout, "repair: nothing to do")
		}
		for _, c := range rep.Repaired {
			fmt.Fprintln(stdout, "repaired:", c)
		}
	}
	if n := rep.Problems(); n > 0 {
		fmt.Fprintf(stdout, "%d problem(s) found; `tapflow spool repair %s` fixes them (stop the agent first)\n", n, dir)
		if op == "verify" || op == "repair" {
			return exitRuntime
		}
	} else if op == "verify" {
		fmt.Fprintln(stdout, "verify: ok")
	}
	return exitOK
}

func printSpoolReport(w io.Writer, r *spool.Report) {
	state := "not in use"
	if r.Locked {
		state = "in use by a running agent"
	}
	fmt.Fprintf(w, "spool %s (%s)\n", r.Dir, state)
	fmt.Fprintf(w, "cursor: segment %d offset %d\n", r.CursorSegment, r.CursorOffset)
	fmt.Fprintf(w, "pending: %d batches, %d records, %d bytes\n", r.Pending, r.PendingRecords, r.PendingBytes)
	if len(r.Segments) == 0 {
		fmt.Fprintln(w, "no segments")
		return
	}
	fmt.Fprintf(w, "%-24s %12s %8s %9s %10s %21s %21s %s\n", "segment", "bytes", "batches", "consumed", "records", "first_seq", "last_seq", "oldest")
	for _, s := range r.Segments {
		oldest := "-"
		if !s.Oldest.IsZero() {
			oldest = s.Oldest.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%020d.seg %12d %8d %9d %10d %21d %21d %s\n", s.ID, s.Size, s.Entries, s.Consumed, s.Records, s.FirstSeq, s.LastSeq, oldest)
		if !s.Header {
			fmt.Fprintf(w, "  PROBLEM: no valid segment header\n")
		}
		for _, p := range s.Problems {
			kind := "corrupt"
			if p.Torn {
				kind = "torn tail"
			}
			fmt.Fprintf(w, "  PROBLEM: %s at offset %d, %d bytes: %s\n", kind, p.Offset, p.Length, p.Reason)
		}
	}
}
