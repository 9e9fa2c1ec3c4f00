package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// MeterOptions configure a MeterPublisher.
type MeterOptions struct {
	AgentID  string // identity stamped on records and message ids
	Node     string // subject suffix
	StateDir string // where the meter batch sequence reservation lives (file meter_seq)
	NATS     transport.Config
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// MeterPublisher is the agent's meter pipeline sink
// (pipeline.SinkOf[schemas.Meter]): it stamps every meter record with its
// identity (agent_id, batch_seq from its own sequence file meter_seq,
// record_index), encodes each batch as one Arrow IPC message and publishes
// it to TAPFLOW_METERS on tapflow.meters.v1.<node> with
// Nats-Msg-Id = <agent_id>-<batch_seq>, retrying with the same id until
// JetStream acks (a retry after a lost ack is deduplicated). There is no
// spool: meter batches are small and the meter source coalesces what waits
// (see pipeline/sources/ebpf.MeterFeed), so an outage costs memory per tap,
// not per interval.
type MeterPublisher struct {
	opts    MeterOptions
	js      jetstream.JetStream
	enc     *schemas.EncoderOf[schemas.Meter]
	seq     *seqAllocator
	subject string
	body    []byte
	log     *slog.Logger
	m       meterMetrics
}

type meterMetrics struct {
	published, records, retries, dupes prometheus.Counter
}

// NewMeters validates options; it does no I/O beyond reading the sequence
// file.
func NewMeters(js jetstream.JetStream, opts MeterOptions) (*MeterPublisher, error) {
	if opts.AgentID == "" || opts.Node == "" {
		return nil, errors.New("natspub meters: agent id and node are required")
	}
	enc, err := schemas.NewEncoderFor(schemas.MeterTable, opts.NATS.Codec)
	if err != nil {
		return nil, fmt.Errorf("natspub meters: %w", err)
	}
	seq, err := newSeqAllocatorFile(opts.StateDir, "meter_seq")
	if err != nil {
		return nil, fmt.Errorf("natspub meters: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &MeterPublisher{opts: opts, js: js, enc: enc, seq: seq, subject: transport.MetersSubject(opts.Node),
		log: opts.Logger.With("component", "natspub-meters")}
	p.m = meterMetrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_meter_batches_total", Help: "Meter batches acknowledged by JetStream."}),
		records:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_meter_records_total", Help: "Meter records in batches acknowledged by JetStream."}),
		retries:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_meter_retries_total", Help: "Meter publish attempts that failed and were retried."}),
		dupes:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_meter_duplicates_total", Help: "Meter publishes JetStream reported as duplicates (a retry after a lost ack)."}),
	}
	if opts.Registry != nil {
		for i, c := range []prometheus.Collector{p.m.published, p.m.records, p.m.retries, p.m.dupes} {
			if err := opts.Registry.Register(c); err != nil {
				for _, r := range []prometheus.Collector{p.m.published, p.m.records, p.m.retries, p.m.dupes}[:i] {
					opts.Registry.Unregister(r)
				}
				return nil, fmt.Errorf("natspub meters: register metrics: %w", err)
			}
		}
	}
	return p, nil
}

// Name implements pipeline.SinkOf.
func (p *MeterPublisher) Name() string { return "publish-meters" }

// Run implements pipeline.SinkOf: each batch is acked nil once JetStream
// acked it, or with the error when ctx ended first (hard stop) or no batch
// sequence could be reserved; the latter also stops Run with the error.
func (p *MeterPublisher) Run(ctx context.Context, in <-chan *pipeline.BatchOf[schemas.Meter]) error {
	var runErr error
	for b := range in {
		if ctx.Err() != nil || runErr != nil {
			b.Ack(fmt.Errorf("publish meters: %w", firstErr(runErr, ctx.Err())))
			continue
		}
		seq, err := p.publishRecords(ctx, b.Records)
		b.Seq = seq
		if errors.Is(err, errSequence) {
			runErr = err
		}
		b.Ack(err)
	}
	return runErr
}

// publishRecords publishes recs as one message, or as halves when the
// message exceeds the server's max_payload. It returns the first sequence.
func (p *MeterPublisher) publishRecords(ctx context.Context, recs []schemas.Meter) (int64, error) {
	seq, err := p.seq.Next()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errSequence, err)
	}
	for i := range recs {
		r := &recs[i]
		r.AgentID, r.BatchSeq, r.RecordIndex = p.opts.AgentID, seq, int32(i)
	}
	if p.body, err = p.enc.Encode(p.body[:0], recs); err != nil {
		return seq, fmt.Errorf("publish meter batch %d: %w", seq, err)
	}
	limit := p.js.Conn().MaxPayload()
	if limit <= 0 {
		limit = transport.MaxPayload
	}
	if int64(len(p.body)) > limit-4096 && len(recs) > 1 {
		half := len(recs) / 2
		first, err := p.publishRecords(ctx, recs[:half])
		if err != nil {
			return first, err
		}
		_, err = p.publishRecords(ctx, recs[half:])
		return first, err
	}
	id := p.opts.AgentID + "-" + strconv.FormatInt(seq, 10)
	msg := &nats.Msg{Subject: p.subject, Data: p.body, Header: nats.Header{}}
	delay := 100 * time.Millisecond
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, p.opts.NATS.PublishTimeout.D())
		ack, err := p.js.PublishMsg(pctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(transport.MetersStream))
		cancel()
		if err == nil {
			p.m.published.Inc()
			p.m.records.Add(float64(len(recs)))
			if ack.Duplicate {
				p.m.dupes.Inc()
			}
			return seq, nil
		}
		p.m.retries.Inc()
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			p.log.Warn("meter publish failed; retrying (batch kept in memory)", "subject", p.subject, "msg_id", id,
				"attempt", attempt, "retry_in", delay, "err", err)
		}
		select {
		case <-ctx.Done():
			return seq, fmt.Errorf("publish meters %s: gave up at shutdown after %d attempts: %w", id, attempt, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}
