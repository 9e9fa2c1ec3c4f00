package audit

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Print writes the summary, then every mismatch (or, with all, every hour
// of every key, marked ok or MISMATCH), then the verdict line.
func (r *Result) Print(w io.Writer, all bool) error {
	fmt.Fprintf(w, "audit %s: %d flow files (%d records), %d meter files (%d records), %d node×tap×direction keys, %d key-hours\n",
		r.Output, r.FlowFiles, r.FlowRecords, r.MeterFiles, r.MeterRecords, r.Keys, len(r.Hours))
	if all {
		tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "node\ttap\tdir\thour\tflow_bytes\tmeter_bytes\tlost_bytes\tdiff\trunning\tallowed\tstatus")
		for _, h := range r.Hours {
			status := "ok"
			if !h.OK {
				status = "MISMATCH"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%+d\t%+d\t[-%d,+%d]\t%s\n", h.Node, h.Ifname, h.Direction, h.Hour.Format("2006-01-02T15Z"),
				h.Flow.Bytes, h.Meter.Bytes, h.Lost.Bytes, h.Diff.Bytes, h.Carry.Bytes, h.Below.Bytes, h.Above.Bytes, status)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, m := range r.Mismatches {
		fmt.Fprintln(w, "MISMATCH", m)
	}
	if len(r.Hours) == 0 {
		fmt.Fprintln(w, "nothing checked: no flow or meter record in the range (without --to, the hours ending after now − --settle are left out; --settle 0 includes them)")
	}
	verdict := "OK: conserved"
	if !r.OK() {
		verdict = fmt.Sprintf("FAILED: %d mismatches", len(r.Mismatches))
	}
	_, err := fmt.Fprintf(w, "%s: Σ flow %d bytes / %d packets, Σ meter %d / %d, lost %d / %d\n",
		verdict, r.Flow.Bytes, r.Flow.Packets, r.Meter.Bytes, r.Meter.Packets, r.Lost.Bytes, r.Lost.Packets)
	return err
}
