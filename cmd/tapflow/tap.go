package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/tapflow/tapflow/internal/report"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/ordered"
	"github.com/tapflow/tapflow/transport/roles"
)

const tapLong = `Print flow.v1 records live, as agents publish them to NATS (TAPFLOW_FLOWS).

tap reads through an ordered ephemeral consumer that starts at new messages
and acks nothing: it never takes a message from the collector, and holds
one in the stream only until it was sent to tap. The consumer is named
after the NATS user, <user>-<i> for the first free i below --slots (an
ordered subscriber may create only those names: docs/security.md); tap
deletes it at exit (the server does within 10s if tap is killed, freeing
the slot). The user is nats.user, else the name in nats.inbox_prefix
(_INBOX.<name>), else tapflow-tap. A record shows within
a second of its batch's publish. With source ebpf a flow is published when
the capture exports it: a long-lived flow at least every
capture.active_timeout, an idle one capture.idle_timeout after its last
packet (looked for every capture.sweep_interval). With source synthetic a
batch is published when it holds synthetic.batch_records or its first
record is synthetic.batch_max_age old.

Filters combine (AND): --node reads only that node's subject
(tapflow.flows.v1.<node>); --tenant matches tenant_id, --zone zone, --port
src_port or dst_port.

Output: table (one line per record, --format table) or json (one flow.v1
record per line, column names and units of docs/schema.md).

Connects like the other commands: nats.url and credentials of --config, or
nats.listen of an embedded server (set it on the running tapflow), or
--nats-url.

Exit codes: 0 ok (--limit reached or interrupted), 1 failure, 2 usage.`

const tapExample = `  tapflow tap --config /etc/tapflow/tapflow.yaml --tenant 4f0c… --zone external
  tapflow tap --nats-url nats://127.0.0.1:4222 --node cmp7 --port 443 --limit 20
  tapflow tap --config /etc/tapflow/tapflow.yaml --format json | jq .bytes`

// tapInactive is how soon the server deletes a tap consumer nobody pulls
// from (a killed tap), freeing its slot: tap's pulls keep it alive while
// tap runs.
const tapInactive = 10 * time.Second

// tapSlotUser is whose slots tap's consumer takes: the user its
// permissions are for (transport/roles.OrderedNames).
func tapSlotUser(c transport.Config) string {
	if c.User != "" {
		return c.User
	}
	if n, ok := strings.CutPrefix(c.InboxPrefix, "_INBOX."); ok && n != "" && !strings.Contains(n, ".") {
		return n
	}
	return "tapflow-tap"
}

// tapFilter selects the records tap prints.
type tapFilter struct {
	tenant, zone, node string
	port               int32 // -1: any
}

func (f tapFilter) match(r *schemas.Flow) bool {
	return (f.tenant == "" || r.TenantID == f.tenant) &&
		(f.zone == "" || r.Zone == f.zone) &&
		(f.node == "" || r.Node == f.node) &&
		(f.port < 0 || r.SrcPort == f.port || r.DstPort == f.port)
}

func init() { register(newTapCmd) }

func newTapCmd() *cobra.Command {
	var (
		cf                         cfgFlags
		tenant, zone, node, format string
		port, limit, slots         int
		timeout                    time.Duration
	)
	cmd := &cobra.Command{
		Use:     "tap [flags]",
		Short:   "print flow records live from NATS, filtered by tenant, zone, node, port; never disturbs the collector",
		Long:    tapLong,
		Example: tapExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return usageErr("--format %q: use table or json", format)
			}
			if zone != "" && !contains(report.Zones, zone) {
				return usageErr("--zone %q: unknown; use one of %s", zone, strings.Join(report.Zones, ", "))
			}
			if port < -1 || port > 65535 {
				return usageErr("--port %d: use 0..65535", port)
			}
			if limit < 0 {
				return usageErr("--limit %d: use 0 (no limit) or more", limit)
			}
			if slots < 1 || slots > roles.MaxOrderedSlots {
				return usageErr("--slots %d: use 1..%d (the user's nats.server.users[].ordered_slots)", slots, roles.MaxOrderedSlots)
			}
			if strings.ContainsAny(node, ".*> \t") {
				return usageErr("--node %q: a node name, without NATS wildcards or dots", node)
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			ncfg, err := natsTarget(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			f := tapFilter{tenant: tenant, zone: zone, node: node, port: int32(port)}
			return tap(ctx, ncfg, f, tapOptions{format: format, limit: limit, slots: slots, timeout: timeout}, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	cf.bindConfig(fs, "read the config from `FILE` (YAML): nats.url, credentials and TLS of the nats section, or nats.listen")
	cf.bindNATSURL(fs)
	fs.StringVar(&tenant, "tenant", "", "only records of this tenant_id (project ID)")
	fs.StringVar(&zone, "zone", "", "only records of this zone: "+strings.Join(report.Zones, ", "))
	fs.StringVar(&node, "node", "", "only records captured on this node (reads only tapflow.flows.v1.<node>)")
	fs.IntVar(&port, "port", -1, "only records whose src_port or dst_port is this port")
	fs.StringVar(&format, "format", "table", "table or json (one record per line)")
	fs.IntVar(&limit, "limit", 0, "exit after this many records (0: until interrupted)")
	fs.IntVar(&slots, "slots", roles.DefaultOrderedSlots, "how many ordered consumers the NATS user may hold (its ordered_slots): tap takes the first free one")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "bound on creating the consumer (connecting: at most 4s)")
	return cmd
}

// tapOptions are tap's output and consumer settings.
type tapOptions struct {
	format       string
	limit, slots int
	timeout      time.Duration
}

func tap(ctx context.Context, ncfg transport.Config, f tapFilter, o tapOptions, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nc, err := connectCLI(ctx, ncfg, "tapflow-tap", o.timeout, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(o.timeout))
	if err != nil {
		return err
	}
	subject := transport.FlowsSubjectRoot + ".>"
	if f.node != "" {
		subject = transport.FlowsSubject(f.node)
	}
	// Ordered consumer in one of the user's slots: AckNone, recreated
	// under the same name on a gap; the collector's durable never
	// notices it. Under interest retention an AckNone consumer still
	// holds what it has not been sent yet, so it is deleted at exit, and
	// by the server within tapInactive should tap die without deleting it.
	rd, err := ordered.New(js, ordered.Config{Stream: transport.FlowsStream, FilterSubject: subject, User: tapSlotUser(ncfg),
		Slots: o.slots, DeliverPolicy: jetstream.DeliverNewPolicy, InactiveThreshold: tapInactive}, log)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, o.timeout)
	err = rd.Open(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("consumer on %s: %w", transport.FlowsStream, err)
	}
	defer func() {
		if err := rd.Close(); err != nil {
			log.Warn("deleting the tap consumer", "err", err)
		}
		if n := rd.Resets(); n > 0 {
			fmt.Fprintf(stderr, "tapflow tap: consumer %s recreated %d times (gaps or losses; read on from the next stream sequence)\n", rd.Name(), n)
		}
	}()
	fmt.Fprintf(stderr, "tapping %s (new records only, consumer %s; Ctrl-C stops)\n", subject, rd.Name())

	d := consume.DefaultConfig()
	dec, err := schemas.NewDecoder().Limited(int64(d.MaxMessageBytes), d.MaxBatchRecords)
	if err != nil {
		return err
	}
	out := newTapWriter(stdout, o.format)
	printed := 0
	var recs []schemas.Flow
	return rd.Run(ctx, func(msg jetstream.Msg) error {
		recs, err = dec.Decode(recs[:0], msg.Data())
		if err != nil {
			fmt.Fprintf(stderr, "tapflow tap: skipping message on %s (%s): %v\n", msg.Subject(), msg.Headers().Get(jetstream.MsgIDHeader), err)
			return nil
		}
		for i := range recs {
			if !f.match(&recs[i]) {
				continue
			}
			if err := out.write(&recs[i]); err != nil {
				return err
			}
			if printed++; o.limit > 0 && printed >= o.limit {
				return ordered.ErrStop
			}
		}
		return nil
	})
}

// tapWriter prints records as aligned table lines or JSON lines.
type tapWriter struct {
	w      io.Writer
	json   *json.Encoder
	header bool
}

func newTapWriter(w io.Writer, format string) *tapWriter {
	t := &tapWriter{w: w}
	if format == "json" {
		t.json = json.NewEncoder(w)
	}
	return t
}

const tapRow = "%-15s  %-12s  %-14s  %-3s  %-36s  %-12s  %-5s  %-45s  %-45s  %8s  %10s\n"

func (t *tapWriter) write(r *schemas.Flow) error {
	if t.json != nil {
		return t.json.Encode(r)
	}
	if !t.header {
		t.header = true
		if _, err := fmt.Fprintf(t.w, tapRow, "time_end", "node", "ifname", "dir", "tenant_id", "zone", "proto", "src", "dst", "packets", "bytes"); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(t.w, tapRow,
		time.UnixMicro(r.TimeEnd).UTC().Format("15:04:05.000000"), r.Node, r.Ifname, r.Direction, r.TenantID, r.Zone,
		protoName(r.Protocol), hostPort(r.SrcIP, r.SrcPort), hostPort(r.DstIP, r.DstPort),
		strconv.FormatInt(r.Packets, 10), strconv.FormatInt(r.Bytes, 10))
	return err
}

func protoName(p int32) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmp6"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

func hostPort(ip string, port int32) string {
	if port == 0 {
		return ip
	}
	return net.JoinHostPort(ip, strconv.Itoa(int(port)))
}
