package audit

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

const hourFmt = "2006-01-02T15Z"

// Print writes the summary, then every mismatch (or, with all, every hour
// of every key, marked ok or MISMATCH), the hours the range left out and
// why, then the verdict line: "OK: conserved", "FAILED: n mismatches" or
// "NOTHING CHECKED".
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
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%+d\t%+d\t[-%d,+%d]\t%s\n", h.Node, h.Ifname, h.Direction, h.Hour.Format(hourFmt),
				h.Flow.Bytes, h.Meter.Bytes, h.Lost.Bytes, h.Diff.Bytes, h.Carry.Bytes, h.Below.Bytes, h.Above.Bytes, status)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, m := range r.Mismatches {
		fmt.Fprintln(w, "MISMATCH", m)
	}
	r.printLeftOut(w)
	var verdict string
	switch r.Verdict() {
	case Conserved:
		verdict = "OK: conserved"
	case Mismatched:
		verdict = fmt.Sprintf("FAILED: %d mismatches", len(r.Mismatches))
	case NothingChecked:
		why := "no flow or meter record in the range"
		if r.FlowFiles+r.MeterFiles == 0 && len(r.LeftOut) == 0 {
			why = "the output holds no flow.v1 or meter.v1 file (is --data the collector output, collector.output?)"
		}
		verdict = "NOTHING CHECKED: " + why + "; this proves nothing"
	}
	_, err := fmt.Fprintf(w, "%s: Σ flow %d bytes / %d packets, Σ meter %d / %d, lost %d / %d\n",
		verdict, r.Flow.Bytes, r.Flow.Packets, r.Meter.Bytes, r.Meter.Packets, r.Lost.Bytes, r.Lost.Packets)
	return err
}

// printLeftOut names the hours holding files outside the range, before
// From and at or after To, and why they were left out.
func (r *Result) printLeftOut(w io.Writer) {
	var before, after []time.Time
	for _, h := range r.LeftOut {
		if !r.From.IsZero() && h.Before(r.From.Truncate(time.Hour)) {
			before = append(before, h)
		} else {
			after = append(after, h)
		}
	}
	if len(before) > 0 {
		fmt.Fprintf(w, "left out: %s: before --from %s\n", hourRanges(before), r.From.UTC().Format(hourFmt))
	}
	if len(after) == 0 {
		return
	}
	to := r.To.UTC().Format(hourFmt)
	if r.Settle > 0 {
		fmt.Fprintf(w, "left out: %s: newer than now − --settle %s (hours from %s on; files may still be written: collector.roll_age, capture.active_timeout); --settle 0 checks them once the pipeline has stopped or settled\n",
			hourRanges(after), r.Settle, to)
		return
	}
	fmt.Fprintf(w, "left out: %s: at or after --to %s\n", hourRanges(after), to)
}

// hourRanges formats sorted hours as runs of consecutive hours:
// "2026-12-01T22Z…2026-12-02T01Z (4 hours), 2026-12-03T10Z".
func hourRanges(hours []time.Time) string {
	var b strings.Builder
	for i := 0; i < len(hours); {
		j := i + 1
		for j < len(hours) && hours[j].Sub(hours[j-1]) == time.Hour {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(hours[i].Format(hourFmt))
		if j-i > 1 {
			fmt.Fprintf(&b, "…%s (%d hours)", hours[j-1].Format(hourFmt), j-i)
		}
		i = j
	}
	return b.String()
}
