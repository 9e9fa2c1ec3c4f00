// Package publish is the agent's pipeline sink for every record type it
// ships (flows, meters: see Kind): it encodes each batch as one Arrow IPC
// message whose identity columns (agent_id, batch_seq, record_index) are
// the batch's (schemas.Identity: the records are not stamped) and
// publishes it to JetStream on <subject root>.<node>
// with Nats-Msg-Id = <agent_id>-<batch_seq>. A batch is acked (released)
// only after JetStream's publish ack, or once it is durably in the agent
// spool; until then it is retried with the same message id, so a retry
// after a lost ack is deduplicated by the server.
//
// With a spool (Options.Spool), a batch whose publish fails or times out —
// and every batch after it — is appended to the spool instead of blocking
// the pipeline; a replayer publishes the spool oldest first, and batches go
// straight to JetStream again once it is empty, so order is kept. A batch
// the spool cannot take (full, disk error) is acked with the error and
// counted as lost (tapflow_spool_dropped_*), with a rate-limited log line.
// Without a spool (meters: batches are small and the meter feed coalesces
// what waits) a batch is retried in memory until JetStream acks it.
//
// What JetStream acknowledged in the last second before the connection was
// lost is published again, with the same message ids, once it is back: a
// stopping nats-server can drop what it acknowledged last (resend.go).
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// Options configure a publisher.
type Options struct {
	AgentID  string // identity stamped on records and message ids
	Node     string // subject suffix
	StateDir string // where the batch sequence reservation lives (Kind.SeqFile)
	NATS     transport.Config
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Spool, when set, takes batches while JetStream is unreachable or
	// slow. Run opens it and closes it.
	Spool *spool.Spool
	// PlainStrings sends every string column as plain utf8, the wire form
	// of agents before wire dictionaries (schemas.EncoderOf.PlainStrings):
	// for measurements and mixed-fleet tests, not a config key.
	PlainStrings bool
}

// MeterOptions configure the meter publisher (no spool by default).
type MeterOptions = Options

// Publisher is the flow publisher, a pipeline.Sink.
type Publisher = PublisherOf[schemas.Flow]

// MeterPublisher is the meter publisher, a pipeline.SinkOf[schemas.Meter].
type MeterPublisher = PublisherOf[schemas.Meter]

// PublisherOf publishes batches of one Kind; it is a pipeline.SinkOf[T].
type PublisherOf[T any] struct {
	kind    Kind[T]
	opts    Options
	js      jetstream.JetStream
	enc     *schemas.EncoderOf[T]
	seq     *seqAllocator
	subject string
	body    []byte // reused encode buffer (Run is single-goroutine)
	log     *slog.Logger
	m       metrics

	sp       *spool.Spool
	kick     chan struct{} // wakes the replayer
	replayMu sync.Mutex
	failing  bool // last replay attempt failed
	lossLog  transport.RateLog
	spoolLog transport.RateLog
	fullLog  transport.RateLog
	full     atomic.Bool // the last publish attempt found the stream full
	recent   recentAcks  // acknowledged in the last resendWindow (resend.go)
}

type metrics struct {
	published prometheus.Counter
	records   prometheus.Counter
	bytes     prometheus.Counter
	retries   prometheus.Counter
	dupes     prometheus.Counter
	splits    prometheus.Counter
	latency   prometheus.Histogram
	full      prometheus.Counter // tapflow_publish_refused_total{stream,reason="stream_full"}
	collide   prometheus.Counter
	resent    prometheus.Counter
	// resendDropped: acks at risk dropped from the resend's keep (resend.go).
	resendDropped prometheus.Counter
}

func newMetrics(prefix, noun string) metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: prefix + name, Help: help})
	}
	return metrics{
		published:     c("batches_total", noun+" acknowledged by JetStream."),
		records:       c("records_total", "Records in "+noun+" acknowledged by JetStream."),
		bytes:         c("bytes_total", "Message bytes of "+noun+" acknowledged by JetStream (after compression)."),
		retries:       c("retries_total", "Publish attempts of "+noun+" that failed and were retried."),
		dupes:         c("duplicates_total", "Publishes of "+noun+" JetStream reported as duplicates (a retry after a lost ack)."),
		splits:        c("splits_total", noun+" split in two because their message exceeded the server's max_payload."),
		resent:        c("resent_total", noun+" JetStream had acknowledged, published again after the connection came back (a stopping server may drop what it acknowledged last; the stream drops what it kept as duplicates)."),
		resendDropped: c("resend_dropped_total", noun+" JetStream had acknowledged just before a connection loss that were not published again: a second loss came before the publisher looked, with more at risk than the 4 MiB it keeps (a stopping server may have dropped them)."),
		collide:       c("id_collisions_total", "First publishes of "+noun+" JetStream reported as duplicates: another publisher used the Nats-Msg-Id first (a forgery, or two agents with one agent.id); each was republished under a new batch_seq."),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: prefix + "seconds", Help: "Time from publish to JetStream ack of " + noun + ".",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
}

func (m metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.records, m.bytes, m.retries, m.dupes, m.splits, m.latency, m.collide, m.resent, m.resendDropped}
}

// New returns the flow publisher: NewFor(js, Flows, opts).
func New(js jetstream.JetStream, opts Options) (*Publisher, error) { return NewFor(js, Flows, opts) }

// NewMeters returns the meter publisher: NewFor(js, Meters, opts).
func NewMeters(js jetstream.JetStream, opts MeterOptions) (*MeterPublisher, error) {
	return NewFor(js, Meters, opts)
}

// NewFor validates options and registers the metrics; it does no I/O
// beyond reading the sequence file.
func NewFor[T any](js jetstream.JetStream, kind Kind[T], opts Options) (*PublisherOf[T], error) {
	if opts.AgentID == "" || opts.Node == "" {
		return nil, fmt.Errorf("%s: agent id and node are required", kind.Component)
	}
	enc, err := schemas.NewEncoderFor(kind.Table, opts.NATS.Codec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind.Component, err)
	}
	if opts.PlainStrings {
		enc = enc.PlainStrings()
	}
	seq, err := newSeqAllocatorFile(opts.StateDir, kind.SeqFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind.Component, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	p := &PublisherOf[T]{kind: kind, opts: opts, js: js, enc: enc, seq: seq, subject: kind.Subject(opts.Node),
		log: opts.Logger.With("component", kind.Component), sp: opts.Spool, kick: make(chan struct{}, 1),
		m: newMetrics(kind.MetricPrefix, kind.Noun)}
	refused, err := refusedVec(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("%s: register metrics: %w", kind.Component, err)
	}
	p.m.full = refused.WithLabelValues(kind.Stream, "stream_full") // exists at 0 from start
	if opts.Registry != nil {
		cs := p.m.collectors()
		for i, c := range cs {
			if err := opts.Registry.Register(c); err != nil {
				for _, r := range cs[:i] {
					opts.Registry.Unregister(r)
				}
				return nil, fmt.Errorf("%s: register metrics: %w", kind.Component, err)
			}
		}
	}
	return p, nil
}

// Name implements pipeline.SinkOf.
func (p *PublisherOf[T]) Name() string { return p.kind.Name }

// Run implements pipeline.SinkOf. Publishing is synchronous per batch: at
// 16K records per batch one round trip per batch costs ~1 ms, far below the
// encode cost, and it keeps order and retry logic trivial. Each batch is
// acked nil once JetStream (or the spool) has it, or with the error when
// ctx ended first (hard stop, no spool) or no batch sequence could be reserved; the
// latter also stops Run with the error (the runner fails what is left).
//
// With a spool, Run opens it first (replaying what a previous run left),
// and once in is closed waits until the spool is drained, replay fails, or
// ctx ends; what is left stays on disk for the next start.
func (p *PublisherOf[T]) Run(ctx context.Context, in <-chan *pipeline.BatchOf[T]) error {
	var stopReplay func()
	if p.sp != nil {
		if err := p.sp.Open(); err != nil {
			return fmt.Errorf("publish: open spool: %w", err)
		}
		defer func() {
			if err := p.sp.Close(); err != nil {
				p.log.Warn("closing spool", "dir", p.sp.Dir(), "err", err)
			}
		}()
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{}, 2)
		go func() { defer func() { done <- struct{}{} }(); p.replay(rctx) }()
		go func() { defer func() { done <- struct{}{} }(); p.syncLoop(rctx) }()
		stopReplay = func() { cancel(); <-done; <-done }
		p.wake()
	}
	var runErr error
	for b := range in {
		// A hard stop (ctx ended: shutdown_timeout passed) with a spool
		// still takes every batch the pipeline hands over: publishing
		// fails at once and the batch goes to the spool, replayed at the
		// next start, so a slow shutdown loses nothing. Without a spool
		// the batch is failed back to the pipeline.
		if ctx.Err() != nil && p.sp == nil {
			b.Ack(fmt.Errorf("%s: %w", p.kind.Name, ctx.Err()))
			continue
		}
		if len(b.Records) == 0 {
			// Nothing to deliver, and the collector dead-letters a
			// message without records (reason empty): no message, no
			// batch_seq used.
			b.Ack(nil)
			continue
		}
		seq, err := p.publishRecords(ctx, b.Records)
		b.Seq = seq
		b.Ack(err)
		if errors.Is(err, errSequence) {
			runErr = err // cannot guarantee unique ids: stop the agent
			break
		}
	}
	if stopReplay != nil && runErr == nil {
		p.resendAfterReconnect(ctx)
		p.waitDrained(ctx)
		stopReplay()
		if n, bytes := p.sp.Pending(); n > 0 {
			p.log.Warn("stopping with batches in the spool; they are replayed at the next start", "dir", p.sp.Dir(), "batches", n, "bytes", bytes)
		}
	} else if stopReplay != nil {
		stopReplay()
	}
	if stopReplay == nil && runErr == nil {
		p.resendAfterReconnect(ctx) // a loss just before the input ended
	}
	return runErr
}

var errSequence = errors.New("batch sequence unavailable")

// errIDCollision: the first publish of a batch was acked as a duplicate.
// Sequences never repeat, so another publisher sent this Nats-Msg-Id
// first (docs/security.md): the batch itself was not stored.
var errIDCollision = errors.New("Nats-Msg-Id already used by another publisher")

// maxCollisions bounds the republishes of one batch under new sequences.
const maxCollisions = 8

// publishRecords publishes recs as one message, or, when the encoded
// message exceeds the server's max_payload, as two halves (recursively),
// each with its own batch_seq. It returns the first sequence used. A batch
// whose message id someone else used first is republished under a new
// sequence, jumped ahead by a random amount so ids burned in advance do
// not catch it again.
func (p *PublisherOf[T]) publishRecords(ctx context.Context, recs []T) (int64, error) {
	for attempt := 1; ; attempt++ {
		seq, err := p.publishRecordsOnce(ctx, recs)
		if !errors.Is(err, errIDCollision) {
			return seq, err
		}
		p.m.collide.Inc()
		p.log.Error("JetStream already holds this batch's Nats-Msg-Id from another publisher (a forged message, or two agents with the same agent.id); republishing under a new batch_seq",
			"subject", p.subject, "msg_id", p.opts.AgentID+"-"+strconv.FormatInt(seq, 10), "records", len(recs), "attempt", attempt,
			"fix", "give every agent its own agent.id, and let only this agent publish on its subject (docs/security.md)")
		if attempt >= maxCollisions {
			return seq, fmt.Errorf("%s batch %d: %w (%d times)", p.kind.Name, seq, errIDCollision, attempt)
		}
		if err := p.seq.Skip(); err != nil {
			return seq, fmt.Errorf("%w: %v", errSequence, err)
		}
	}
}

func (p *PublisherOf[T]) publishRecordsOnce(ctx context.Context, recs []T) (int64, error) {
	seq, err := p.seq.Next()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errSequence, err)
	}
	p.body, err = p.enc.EncodeBatch(p.body[:0], recs, schemas.Identity{AgentID: p.opts.AgentID, BatchSeq: seq})
	if err != nil {
		return seq, fmt.Errorf("%s batch %d: %w", p.kind.Name, seq, err)
	}
	if int64(len(p.body)) > p.payloadLimit()-4096 && len(recs) > 1 {
		p.m.splits.Inc()
		half := len(recs) / 2
		first, err := p.publishRecords(ctx, recs[:half])
		if err != nil {
			return first, err
		}
		_, err = p.publishRecords(ctx, recs[half:])
		return first, err
	}
	return seq, p.publish(ctx, seq, p.body, len(recs))
}

// unknownMaxPayload is assumed before the connection has ever been up
// (agent started during an outage): nats-server's default max_payload, so
// batches spooled meanwhile are not too large for the server once it
// answers (the embedded server's 8 MiB is known at once: in-process).
const unknownMaxPayload = 1 << 20

// payloadLimit is the server's max_payload.
func (p *PublisherOf[T]) payloadLimit() int64 {
	if limit := p.js.Conn().MaxPayload(); limit > 0 {
		return limit
	}
	return unknownMaxPayload
}

// publish sends one batch: straight to JetStream while the spool is empty
// (one attempt), else — or when that attempt fails — into the spool.
// Without a spool it retries until JetStream acks or ctx ends.
func (p *PublisherOf[T]) publish(ctx context.Context, seq int64, body []byte, records int) error {
	p.resendAfterReconnect(ctx)
	msg := &nats.Msg{Subject: p.subject, Data: body,
		Header: transport.BatchHeader(p.enc.Schema(), p.enc.Codec(), p.opts.AgentID, seq, records)}
	id := p.opts.AgentID + "-" + strconv.FormatInt(seq, 10)
	if p.sp == nil {
		return p.publishRetry(ctx, msg, id, records, true)
	}
	// Only Run appends, so an empty spool stays empty until we append:
	// publishing directly now cannot overtake a spooled batch.
	if p.sp.Empty() && p.js.Conn().IsConnected() {
		err := p.publishOnce(ctx, msg, id, records, true)
		if err == nil || errors.Is(err, errIDCollision) {
			return err
		}
		if errors.Is(err, errStreamFull) {
			p.logStreamFull(id, "spooled to disk until the stream has room", err)
		} else if ok, n := p.spoolLog.Allow(30 * time.Second); ok {
			p.log.Warn("NATS unreachable or slow; spooling batches to disk until it answers", "msg_id", id, "spool", p.sp.Dir(), "err", err, "lines_suppressed", n)
		}
	}
	e := &spool.Entry{Seq: seq, Created: time.Now(), Records: records, MsgID: id, Subject: p.subject, Body: body}
	if err := p.sp.Append(e); err != nil {
		reason := "write_error"
		if errors.Is(err, spool.ErrFull) {
			reason = "full"
		}
		m := p.sp.Metrics()
		m.Dropped.WithLabelValues(reason).Inc()
		m.DroppedRecords.WithLabelValues(reason).Add(float64(records))
		if ok, n := p.lossLog.Allow(10 * time.Second); ok {
			p.log.Error("batch lost: "+p.failureCause()+" and the spool cannot take it", "msg_id", id, "records", records, "reason", reason,
				"err", err, "lost_batches_not_logged", n, "fix", "raise agent.spool.max_bytes or free disk space; see tapflow_spool_dropped_records_total")
		}
		return fmt.Errorf("publish %s: %s and spool refused the batch: %w", id, p.failureCause(), err)
	}
	p.wake()
	return nil
}

// publishOnce makes one publish attempt bounded by publish_timeout.
// first: the batch was never sent before, so a duplicate ack means
// someone else used its id (errIDCollision); on a retry it is the normal
// answer to a publish whose ack was lost.
func (p *PublisherOf[T]) publishOnce(ctx context.Context, msg *nats.Msg, id string, records int, first bool) error {
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, p.opts.NATS.PublishTimeout.D())
	ack, err := p.js.PublishMsg(pctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(p.kind.Stream))
	cancel()
	if err != nil {
		p.m.retries.Inc()
		if isStreamFull(err) {
			p.full.Store(true)
			p.m.full.Inc()
			return fmt.Errorf("%w: %s refused %s: %w", errStreamFull, p.kind.Stream, id, err)
		}
		p.full.Store(false)
		return err
	}
	p.full.Store(false)
	if ack.Duplicate && first {
		return fmt.Errorf("publish %s: %w", id, errIDCollision)
	}
	if n := p.recent.add(time.Now(), p.js.Conn().Stats().Reconnects, msg, id, records); n > 0 {
		p.m.resendDropped.Add(float64(n))
		p.log.Warn("batches acknowledged just before a connection loss will not be published again: a second loss came before the publisher looked, with more at risk than it keeps (a stopping server may have dropped them)",
			"batches", n, "kept_bytes", resendMaxBytes, "see", "tapflow_publish_resend_dropped_total")
	}
	p.m.latency.Observe(time.Since(start).Seconds())
	p.m.published.Inc()
	p.m.records.Add(float64(records))
	p.m.bytes.Add(float64(len(msg.Data)))
	if ack.Duplicate {
		p.m.dupes.Inc()
	}
	// One line per acknowledged batch at debug level: with the stream
	// sequence a lost batch can be followed from the agent to the
	// collector's files (tapflow.batch_seqs), as the cluster chaos test does.
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("batch acknowledged by JetStream", "msg_id", id, "stream_seq", ack.Sequence, "records", records, "duplicate", ack.Duplicate, "first", first)
	}
	return nil
}

// publishRetry retries until JetStream acks or ctx (the hard stop) ends;
// first: the batch was never sent before (see publishOnce).
func (p *PublisherOf[T]) publishRetry(ctx context.Context, msg *nats.Msg, id string, records int, first bool) error {
	delay := 100 * time.Millisecond
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		err := p.publishOnce(ctx, msg, id, records, first && attempt == 1)
		if err == nil || errors.Is(err, errIDCollision) {
			return err
		}
		if errors.Is(err, errStreamFull) {
			p.logStreamFull(id, "kept in memory and retried", err)
		} else if time.Since(lastLog) > 10*time.Second {
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

// resendAfterReconnect publishes again, when the connection has come back
// since the last look, what JetStream acknowledged in the resendWindow
// before (resend.go): into the spool, which replays it oldest first, or
// without one, straight to JetStream until acked. Run's goroutine only:
// an empty spool stays empty until Run appends.
func (p *PublisherOf[T]) resendAfterReconnect(ctx context.Context) {
	nc := p.js.Conn()
	if nc == nil {
		return
	}
	again := p.recent.acknowledgedBefore(nc.Stats().Reconnects)
	if len(again) == 0 {
		return
	}
	records := 0
	for _, a := range again {
		records += a.records
	}
	p.log.Info("connection to NATS back; publishing again the batches acknowledged just before it was lost (a stopping server may drop what it acknowledged last)",
		"batches", len(again), "records", records, "window", resendWindow)
	p.m.resent.Add(float64(len(again)))
	for _, a := range again {
		e := &spool.Entry{Seq: a.seq, Created: a.at, Records: a.records, MsgID: a.id, Subject: a.subject, Body: a.body}
		if p.sp == nil {
			msg := &nats.Msg{Subject: e.Subject, Data: e.Body, Header: p.spooledHeader(e)}
			if err := p.publishRetry(ctx, msg, e.MsgID, e.Records, false); err != nil {
				p.log.Warn("batch not published again; JetStream acknowledged it before", "msg_id", a.id, "err", err)
			}
			continue
		}
		if err := p.sp.Append(e); err != nil {
			p.log.Warn("batch not published again: the spool refused it; JetStream acknowledged it before", "msg_id", a.id, "err", err)
		}
	}
	if p.sp != nil {
		p.wake()
	}
}
