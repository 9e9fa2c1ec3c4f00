package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/dlq"
)

const dlqLong = `Dead letters: messages the collector rejected and moved whole, with their
original headers and the reason, to TAPFLOW_DLQ (docs/delivery.md, Dead
letters). Reasons: decode (not a tapflow batch), size (over
collector.max_message_bytes or max_batch_records), identity (records do not
match the subject's node, the Nats-Msg-Id or the batch headers), time (time_end beyond
collector.max_clock_skew ahead or max_record_age old), poison (a collector
process died decoding it, and it was delivered more than
collector.poison_deliveries times: keep it for the bug report), empty (no
records: nothing to replay).

Each sender (node) keeps at most collector.dlq_letters_per_node letters: the
collector deletes a sender's own oldest beyond that, never another's.
inspect ends with those evictions per sender (letters, bytes, records,
reasons).

  inspect  list dead letters: DLQ seq, time, reason, original subject,
           message id, bytes, records (when decodable) and the error; read-only
  replay   republish the selected dead letters to their original subject with
           their original Nats-Msg-Id, and delete each from the DLQ only after
           JetStream acked it. Fix the cause first (e.g. the agent's clock, or
           raise collector.max_clock_skew and restart the collector): a replay
           the collector still refuses is dead-lettered again. Within the
           stream's duplicate window (nats.duplicate_window) of the original,
           JetStream dedupes the replay away: such letters are kept ("held")
           and exit code 1 says to retry later.

Connects like the other commands: nats.url of --config, or nats.listen of an
embedded server (set it on the running tapflow), or --nats-url.

Exit codes: 0 ok, 1 failure or (replay) a selected letter not replayed, 2 usage.`

const dlqExample = `  tapflow dlq inspect --config /etc/tapflow/tapflow.yaml --reason time
  tapflow dlq replay --config /etc/tapflow/tapflow.yaml --reason time --dry-run
  tapflow dlq replay --config /etc/tapflow/tapflow.yaml --subject 'tapflow.flows.v1.cmp7'`

func init() { register(newDLQCmd) }

func newDLQCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:     "dlq inspect|replay",
		Short:   "list dead letters the collector rejected, replay them once fixed",
		Long:    dlqLong,
		Example: dlqExample,
	}, newDLQOpCmd("inspect", "list dead letters; read-only"), newDLQOpCmd("replay", "republish dead letters to their original subject, then delete them from the DLQ"))
}

// newDLQOpCmd builds dlq inspect or dlq replay: the same selection flags,
// --dry-run for replay only.
func newDLQOpCmd(op, short string) *cobra.Command {
	var (
		cf                            cfgFlags
		reason, subject, seqs, format string
		dryRun                        bool
		timeout                       time.Duration
	)
	cmd := &cobra.Command{
		Use:     op + " [flags]",
		Short:   short,
		Long:    dlqLong,
		Example: dlqExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := dlq.Filter{Reason: reason, Subject: subject}
			if f.Reason != "" && !contains(consume.Reasons, f.Reason) {
				return usageErr("--reason %q: unknown; use one of %s", f.Reason, strings.Join(consume.Reasons, ", "))
			}
			if seqs != "" {
				f.Seqs = map[uint64]bool{}
				for _, s := range strings.Split(seqs, ",") {
					n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
					if err != nil {
						return usageErr("--seq %q: not a sequence number", s)
					}
					f.Seqs[n] = true
				}
			}
			if format != "table" && format != "json" {
				return usageErr("--format %q: use table or json", format)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ncfg, err := natsTarget(cfg)
			if err != nil {
				return err
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, stop := signalContext()
			defer stop()
			nc, err := connectCLI(ctx, ncfg, "tapflow-dlq", timeout, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(timeout))
			if err != nil {
				return err
			}
			if op == "inspect" {
				return exitCode(dlqInspect(ctx, js, f, format, stdout, stderr))
			}
			return exitCode(dlqReplay(ctx, js, f, dryRun, timeout, format, stdout, stderr))
		},
	}
	fs := cmd.Flags()
	cf.bindConfig(fs, "read the config from `FILE` (YAML): nats.url, nats.creds_file, nats.listen")
	cf.bindNATSURL(fs)
	fs.StringVar(&reason, "reason", "", "only dead letters of this reason: "+strings.Join(consume.Reasons, ", "))
	fs.StringVar(&subject, "subject", "", "only dead letters whose original subject matches (NATS wildcards * and >), e.g. tapflow.flows.v1.cmp7")
	fs.StringVar(&seqs, "seq", "", "only these DLQ sequences, comma-separated")
	fs.StringVar(&format, "format", "table", op+" output: table or json (one object per line)")
	if op == "replay" {
		fs.BoolVar(&dryRun, "dry-run", false, "show what would be replayed; publish and delete nothing")
	}
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "bound on each request (connecting: at most 4s)")
	return cmd
}

func dlqInspect(ctx context.Context, js jetstream.JetStream, f dlq.Filter, format string, stdout, stderr io.Writer) int {
	n, bytes := 0, 0
	enc := json.NewEncoder(stdout)
	if format == "table" {
		fmt.Fprintf(stdout, "%8s  %-20s  %-8s  %-28s  %-28s  %10s  %8s  %s\n", "seq", "time", "reason", "original_subject", "msg_id", "bytes", "records", "error")
	}
	err := dlq.List(ctx, js, f, func(l dlq.Letter) error {
		n++
		bytes += l.Bytes
		if format == "json" {
			return enc.Encode(l)
		}
		recs := "-"
		if l.Records >= 0 {
			recs = strconv.Itoa(l.Records)
		}
		id := l.MsgID
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(stdout, "%8d  %-20s  %-8s  %-28s  %-28s  %10d  %8s  %s\n", l.Seq, l.Time.UTC().Format(time.RFC3339), printable(l.Reason), printable(l.OrigSubject), printable(id), l.Bytes, recs, printable(l.Error))
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq inspect: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintf(stderr, "%d dead letter(s), %d bytes\n", n, bytes)
	if len(f.Seqs) > 0 {
		return exitOK
	}
	evs, err := dlq.Evictions(ctx, js)
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq inspect: evictions: %v\n", err)
		return exitRuntime
	}
	shown, evicted := 0, uint64(0)
	for _, e := range evs {
		if !evictionSelected(f, e) {
			continue
		}
		if shown == 0 && format == "table" {
			fmt.Fprintf(stdout, "\nevicted (a sender's own oldest letters beyond collector.dlq_letters_per_node):\n%-24s  %-14s  %8s  %12s  %10s  %-20s  %-28s  %s\n",
				"sender", "stream", "letters", "bytes", "records", "last", "last_msg_id", "by_reason")
		}
		shown++
		evicted += e.Letters
		if format == "json" {
			if err := enc.Encode(struct {
				Evicted transport.DLQEvictions `json:"evicted"`
			}{e}); err != nil {
				return exitRuntime
			}
			continue
		}
		reasons := make([]string, 0, len(e.ByReason))
		for _, r := range slices.Sorted(maps.Keys(e.ByReason)) {
			reasons = append(reasons, fmt.Sprintf("%s=%d", printable(r), e.ByReason[r]))
		}
		fmt.Fprintf(stdout, "%-24s  %-14s  %8d  %12d  %10d  %-20s  %-28s  %s\n", printable(e.Sender), printable(e.Stream), e.Letters, e.Bytes, e.Records,
			e.Last.UTC().Format(time.RFC3339), printable(e.LastMsgID), strings.Join(reasons, " "))
	}
	if shown > 0 {
		fmt.Fprintf(stderr, "%d dead letter(s) evicted from %d sender(s)\n", evicted, shown)
	}
	return exitOK
}

// evictionSelected applies --reason and --subject to a sender's
// eviction tally (its original subject is the stream's root and the
// sender).
func evictionSelected(f dlq.Filter, e transport.DLQEvictions) bool {
	if f.Reason != "" && e.ByReason[f.Reason] == 0 {
		return false
	}
	if f.Subject == "" {
		return true
	}
	root := transport.FlowsSubjectRoot
	if e.Stream == transport.MetersStream {
		root = transport.MetersSubjectRoot
	}
	return dlq.SubjectMatch(f.Subject, root+"."+e.Sender)
}

func dlqReplay(ctx context.Context, js jetstream.JetStream, f dlq.Filter, dryRun bool, timeout time.Duration, format string, stdout, stderr io.Writer) int {
	counts := map[dlq.Outcome]int{}
	enc := json.NewEncoder(stdout)
	err := dlq.Replay(ctx, js, f, dryRun, timeout, func(r dlq.Result) {
		counts[r.Outcome]++
		if format == "json" {
			_ = enc.Encode(r)
			return
		}
		fmt.Fprintf(stdout, "%8d  %-8s  %-28s  %-28s  %-17s  %s\n", r.Letter.Seq, printable(r.Letter.Reason), printable(r.Letter.OrigSubject), printable(r.Letter.MsgID), r.Outcome, printable(r.Detail))
	})
	var parts []string
	for _, o := range []dlq.Outcome{dlq.WouldReplay, dlq.Replayed, dlq.AlreadyDelivered, dlq.Held, dlq.Skipped, dlq.Failed} {
		if counts[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[o], o))
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "nothing selected")
	}
	fmt.Fprintf(stderr, "replay: %s\n", strings.Join(parts, ", "))
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq replay: %v\n", err)
		return exitRuntime
	}
	if counts[dlq.Held]+counts[dlq.Skipped]+counts[dlq.Failed] > 0 {
		return exitRuntime
	}
	return exitOK
}

// printable escapes what a terminal would interpret in the table: a dead
// letter's headers come from whoever published it (JSON output escapes
// them already).
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}
