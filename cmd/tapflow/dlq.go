package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/dlq"
)

const dlqUsage = `Usage: tapflow dlq inspect|replay [flags]

Dead letters: messages the collector rejected and moved whole, with their
original headers and the reason, to TAPFLOW_DLQ (docs/delivery.md, Dead
letters). Reasons: decode (not a tapflow batch), size (over
collector.max_message_bytes or max_batch_records), identity (records do not
match the subject's node or the Nats-Msg-Id), time (time_end beyond
collector.max_clock_skew ahead or max_record_age old).

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

Examples:
  tapflow dlq inspect --config /etc/tapflow/tapflow.yaml --reason time
  tapflow dlq replay --config /etc/tapflow/tapflow.yaml --reason time --dry-run
  tapflow dlq replay --config /etc/tapflow/tapflow.yaml --subject 'tapflow.flows.v1.cmp7'

Exit codes: 0 ok, 1 failure or (replay) a selected letter not replayed, 2 usage.

Flags:
`

// dlqCmd implements `tapflow dlq`.
func dlqCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "inspect" && args[0] != "replay") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, dlqUsage)
			return exitOK
		}
		fmt.Fprint(stderr, dlqUsage)
		return exitUsage
	}
	op := args[0]
	fs := flag.NewFlagSet("tapflow dlq "+op, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (YAML): nats.url, nats.creds_file, nats.listen")
	natsURL := fs.String("nats-url", "", "override nats.url")
	reason := fs.String("reason", "", "only dead letters of this reason: "+strings.Join(consume.Reasons, ", "))
	subject := fs.String("subject", "", "only dead letters whose original subject matches (NATS wildcards * and >), e.g. tapflow.flows.v1.cmp7")
	seqs := fs.String("seq", "", "only these DLQ sequences, comma-separated")
	format := fs.String("format", "table", "inspect output: table or json (one object per line)")
	dryRun := fs.Bool("dry-run", false, "replay: show what would be replayed; publish and delete nothing")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on connecting and on each request")
	fs.Usage = func() {
		fmt.Fprint(stderr, dlqUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tapflow dlq %s: "+format+"\n", append([]any{op}, a...)...)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q; flags only (see tapflow dlq --help)", fs.Arg(0))
	}
	f := dlq.Filter{Reason: *reason, Subject: *subject}
	if f.Reason != "" && !contains(consume.Reasons, f.Reason) {
		return usageErr("--reason %q: unknown; use one of %s", f.Reason, strings.Join(consume.Reasons, ", "))
	}
	if *seqs != "" {
		f.Seqs = map[uint64]bool{}
		for _, s := range strings.Split(*seqs, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return usageErr("--seq %q: not a sequence number", s)
			}
			f.Seqs[n] = true
		}
	}
	if *format != "table" && *format != "json" {
		return usageErr("--format %q: use table or json", *format)
	}
	if op == "inspect" && *dryRun {
		return usageErr("--dry-run applies to replay only")
	}
	if err := transport.CheckFlagURL(*natsURL); err != nil {
		return usageErr("--nats-url: %v", err)
	}
	cfg, err := loadConfig(*cfgPath, func(c *config.Config) { set(&c.NATS.URL, *natsURL) })
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq %s: invalid config:\n%s\n", op, indent(err))
		return exitUsage
	}
	url := cfg.NATS.URL
	if url == "" && cfg.NATS.Listen != "" {
		url = "nats://" + cfg.NATS.Listen
	}
	if url == "" {
		return usageErr("no NATS to connect to: nats.url is empty and nats.listen is not set, so an embedded server is reachable only inside its own process; set nats.listen (e.g. 127.0.0.1:4222) on the running tapflow, or give --nats-url / --config with nats.url")
	}
	ncfg := cfg.NATS
	ncfg.URL = url
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	nc, err := transport.Connect(cctx, ncfg, "tapflow-dlq", log)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq %s: %v\n", op, err)
		return exitRuntime
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(*timeout))
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq %s: %v\n", op, err)
		return exitRuntime
	}
	if op == "inspect" {
		return dlqInspect(ctx, js, f, *format, stdout, stderr)
	}
	return dlqReplay(ctx, js, f, *dryRun, *timeout, *format, stdout, stderr)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
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
		fmt.Fprintf(stdout, "%8d  %-20s  %-8s  %-28s  %-28s  %10d  %8s  %s\n", l.Seq, l.Time.UTC().Format(time.RFC3339), l.Reason, l.OrigSubject, id, l.Bytes, recs, l.Error)
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "tapflow dlq inspect: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintf(stderr, "%d dead letter(s), %d bytes\n", n, bytes)
	return exitOK
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
		fmt.Fprintf(stdout, "%8d  %-8s  %-28s  %-28s  %-17s  %s\n", r.Letter.Seq, r.Letter.Reason, r.Letter.OrigSubject, r.Letter.MsgID, r.Outcome, r.Detail)
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
