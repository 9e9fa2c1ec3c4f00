// Package natspub is the agent's pipeline sink: it stamps every record with
// its identity (agent_id, batch_seq, record_index), encodes each batch as one
// Arrow IPC message and publishes it to JetStream on tapflow.flows.v1.<node>
// with Nats-Msg-Id = <agent_id>-<batch_seq>. A batch is acked (released) only
// after JetStream's publish ack; until then it is retried with the same
// message id, so a retry after a lost ack is deduplicated by the server.
package natspub

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

	"github.com/tapflow/tapflow/internal/natsx"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// Options configure a Publisher.
type Options struct {
	AgentID  string // identity stamped on records and message ids
	Node     string // subject suffix
	StateDir string // where the batch sequence reservation lives
	NATS     natsx.Config
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// Publisher is a pipeline.Sink.
type Publisher struct {
	opts    Options
	js      jetstream.JetStream
	enc     *schemas.Encoder
	seq     *seqAllocator
	subject string
	body    []byte // reused encode buffer (Run is single-goroutine)
	log     *slog.Logger
	m       metrics
}

type metrics struct {
	published prometheus.Counter
	bytes     prometheus.Counter
	retries   prometheus.Counter
	dupes     prometheus.Counter
	splits    prometheus.Counter
	latency   prometheus.Histogram
}

// New validates options; it does no I/O beyond reading the sequence file.
func New(js jetstream.JetStream, opts Options) (*Publisher, error) {
	if opts.AgentID == "" || opts.Node == "" {
		return nil, errors.New("natspub: agent id and node are required")
	}
	enc, err := schemas.NewEncoder(opts.NATS.Codec)
	if err != nil {
		return nil, err
	}
	seq, err := newSeqAllocator(opts.StateDir)
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &Publisher{opts: opts, js: js, enc: enc, seq: seq, subject: natsx.FlowsSubject(opts.Node),
		log: opts.Logger.With("component", "natspub")}
	p.m = metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_batches_total", Help: "Batches acknowledged by JetStream."}),
		bytes:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_bytes_total", Help: "Message bytes acknowledged by JetStream (after compression)."}),
		retries:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_retries_total", Help: "Publish attempts that failed and were retried."}),
		dupes:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_duplicates_total", Help: "Publishes JetStream reported as duplicates (a retry after a lost ack)."}),
		splits:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_publish_splits_total", Help: "Batches split in two because their message exceeded the server's max_payload."}),
		latency:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tapflow_publish_seconds", Help: "Time from publish to JetStream ack.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	if opts.Registry != nil {
		opts.Registry.MustRegister(p.m.published, p.m.bytes, p.m.retries, p.m.dupes, p.m.splits, p.m.latency)
	}
	return p, nil
}

// Name implements pipeline.Sink.
func (p *Publisher) Name() string { return "publish" }

// Run implements pipeline.Sink. Publishing is synchronous per batch: at
// 16K records per batch one round trip per batch costs ~1 ms, far below the
// encode cost, and it keeps order and retry logic trivial.
func (p *Publisher) Run(ctx context.Context, in <-chan *pipeline.Batch) error {
	for b := range in {
		if ctx.Err() != nil {
			b.Ack(fmt.Errorf("publish: %w", ctx.Err()))
			continue
		}
		seq, err := p.publishRecords(ctx, b.Records)
		b.Seq = seq
		if errors.Is(err, errSequence) {
			b.Ack(err)
			return err // cannot guarantee unique ids: stop the agent
		}
		b.Ack(err)
	}
	return nil
}

var errSequence = errors.New("batch sequence unavailable")

// publishRecords publishes recs as one message, or, when the encoded
// message exceeds the server's max_payload, as two halves (recursively),
// each with its own batch_seq. It returns the first sequence used.
func (p *Publisher) publishRecords(ctx context.Context, recs []schemas.Flow) (int64, error) {
	seq, err := p.seq.Next()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errSequence, err)
	}
	for i := range recs {
		r := &recs[i]
		r.AgentID, r.BatchSeq, r.RecordIndex = p.opts.AgentID, seq, int32(i)
	}
	p.body, err = p.enc.Encode(p.body[:0], recs)
	if err != nil {
		return seq, fmt.Errorf("publish batch %d: %w", seq, err)
	}
	if limit := p.js.Conn().MaxPayload(); limit > 0 && int64(len(p.body)) > limit-4096 && len(recs) > 1 {
		p.m.splits.Inc()
		half := len(recs) / 2
		first, err := p.publishRecords(ctx, recs[:half])
		if err != nil {
			return first, err
		}
		_, err = p.publishRecords(ctx, recs[half:])
		return first, err
	}
	return seq, p.publish(ctx, seq, p.body)
}

// publish retries until JetStream acks or ctx (the hard stop) ends.
func (p *Publisher) publish(ctx context.Context, seq int64, body []byte) error {
	msg := &nats.Msg{Subject: p.subject, Data: body, Header: nats.Header{}}
	id := p.opts.AgentID + "-" + strconv.FormatInt(seq, 10)
	delay := 100 * time.Millisecond
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, p.opts.NATS.PublishTimeout.D())
		ack, err := p.js.PublishMsg(pctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(natsx.FlowsStream))
		cancel()
		if err == nil {
			p.m.latency.Observe(time.Since(start).Seconds())
			p.m.published.Inc()
			p.m.bytes.Add(float64(len(body)))
			if ack.Duplicate {
				p.m.dupes.Inc()
			}
			return nil
		}
		p.m.retries.Inc()
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			p.log.Warn("publish failed; retrying (batch kept in memory)", "subject", p.subject, "msg_id", id, "attempt", attempt, "retry_in", delay, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish %s: gave up at shutdown after %d attempts: %w", id, attempt, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}
