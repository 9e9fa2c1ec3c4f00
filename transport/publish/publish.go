// Package publish is the agent's pipeline sink: it stamps every record with
// its identity (agent_id, batch_seq, record_index), encodes each batch as one
// Arrow IPC message and publishes it to JetStream on tapflow.flows.v1.<node>
// with Nats-Msg-Id = <agent_id>-<batch_seq>. A batch is acked (released) only
// after JetStream's publish ack, or once it is durably in the agent spool;
// until then it is retried with the same message id, so a retry after a
// lost ack is deduplicated by the server.
//
// With a spool (Options.Spool), a batch whose publish fails or times out —
// and every batch after it — is appended to the spool instead of blocking
// the pipeline; a replayer publishes the spool oldest first, and batches go
// straight to JetStream again once it is empty, so order is kept. A batch
// the spool cannot take (full, disk error) is acked with the error and
// counted as lost (tapflow_spool_dropped_*), with a rate-limited log line.
// Without a spool a batch is retried in memory until JetStream acks it.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// Options configure a Publisher.
type Options struct {
	AgentID  string // identity stamped on records and message ids
	Node     string // subject suffix
	StateDir string // where the batch sequence reservation lives
	NATS     transport.Config
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Spool, when set, takes batches while JetStream is unreachable or
	// slow. Run opens it and closes it.
	Spool *spool.Spool
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

	sp       *spool.Spool
	kick     chan struct{} // wakes the replayer
	replayMu sync.Mutex
	failing  bool // last replay attempt failed
	lossLog  rateLog
	spoolLog rateLog
}

// rateLog lets one line through per interval and counts the rest.
type rateLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (r *rateLog) allow(every time.Duration) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.last) < every {
		r.suppressed++
		return false, 0
	}
	r.last, suppressed, r.suppressed = time.Now(), r.suppressed, 0
	return true, suppressed
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
	p := &Publisher{opts: opts, js: js, enc: enc, seq: seq, subject: transport.FlowsSubject(opts.Node),
		log: opts.Logger.With("component", "natspub"), sp: opts.Spool, kick: make(chan struct{}, 1)}
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
//
// With a spool, Run opens it first (replaying what a previous run left),
// and once in is closed waits until the spool is drained, replay fails, or
// ctx ends; what is left stays on disk for the next start.
func (p *Publisher) Run(ctx context.Context, in <-chan *pipeline.Batch) error {
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
		if ctx.Err() != nil {
			b.Ack(fmt.Errorf("publish: %w", ctx.Err()))
			continue
		}
		seq, err := p.publishRecords(ctx, b.Records)
		b.Seq = seq
		b.Ack(err)
		if errors.Is(err, errSequence) {
			runErr = err // cannot guarantee unique ids: stop the agent (the runner fails what is left)
			break
		}
	}
	if stopReplay != nil && runErr == nil {
		p.waitDrained(ctx)
		stopReplay()
		if n, bytes := p.sp.Pending(); n > 0 {
			p.log.Warn("stopping with batches in the spool; they are replayed at the next start", "dir", p.sp.Dir(), "batches", n, "bytes", bytes)
		}
	} else if stopReplay != nil {
		stopReplay()
	}
	return runErr
}

// waitDrained returns once the spool is empty, replay has failed
// continuously for a grace period (2 × publish_timeout + 2s: NATS is
// down, the entries wait on disk for the next start), or ctx ends.
func (p *Publisher) waitDrained(ctx context.Context) {
	grace := 2*p.opts.NATS.PublishTimeout.D() + 2*time.Second
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var failingSince time.Time
	for !p.sp.Empty() {
		p.replayMu.Lock()
		failing := p.failing
		p.replayMu.Unlock()
		switch {
		case !failing:
			failingSince = time.Time{}
		case failingSince.IsZero():
			failingSince = time.Now()
		case time.Since(failingSince) > grace:
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// syncLoop fsyncs the spool every sync_interval, so a spooled batch is
// durable within that bound even when no further append comes.
func (p *Publisher) syncLoop(ctx context.Context) {
	every := max(p.sp.SyncInterval(), 50*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.sp.Sync()
		}
	}
}

func (p *Publisher) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// replay publishes spooled entries oldest first until ctx ends, retrying
// each with backoff; only an acknowledged entry is consumed.
func (p *Publisher) replay(ctx context.Context) {
	delay := 100 * time.Millisecond
	idle := time.NewTicker(time.Second)
	defer idle.Stop()
	var lastLog time.Time
	for ctx.Err() == nil {
		e, ok, err := p.sp.Peek()
		if err != nil {
			p.log.Error("spool replay: cannot read the spool; retrying (run `tapflow spool verify` on it)", "dir", p.sp.Dir(), "err", err)
			p.setFailing(true)
			sleep(ctx, 5*time.Second)
			continue
		}
		if !ok {
			p.sp.Metrics().OldestAge.Set(0)
			p.sp.Sync()
			select {
			case <-ctx.Done():
			case <-p.kick:
			case <-idle.C:
			}
			continue
		}
		p.sp.Metrics().OldestAge.Set(time.Since(e.Created).Seconds())
		msg := &nats.Msg{Subject: e.Subject, Data: e.Body, Header: nats.Header{}}
		err = p.publishOnce(ctx, msg, e.MsgID, len(e.Body))
		if err == nil {
			if aerr := p.sp.Advance(); aerr != nil {
				p.log.Error("spool replay: cannot advance the cursor", "dir", p.sp.Dir(), "err", aerr)
				sleep(ctx, time.Second)
			}
			if p.setFailing(false) {
				p.log.Info("NATS answers again; replaying the spool", "dir", p.sp.Dir())
			}
			delay = 100 * time.Millisecond
			continue
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			p.sp.Metrics().Dropped.WithLabelValues("too_large").Inc()
			p.sp.Metrics().DroppedRecords.WithLabelValues("too_large").Add(float64(e.Records))
			p.log.Error("spooled batch exceeds the server's max_payload; dropped", "msg_id", e.MsgID, "bytes", len(e.Body), "records", e.Records)
			_ = p.sp.Advance()
			continue
		}
		p.setFailing(true)
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			n, bytes := p.sp.Pending()
			p.log.Warn("spool replay: publish failed; retrying", "msg_id", e.MsgID, "spooled_batches", n, "spooled_bytes", bytes, "retry_in", delay, "err", err)
		}
		sleep(ctx, delay)
		delay = min(delay*2, 5*time.Second)
	}
}

func (p *Publisher) setFailing(v bool) (changed bool) {
	p.replayMu.Lock()
	defer p.replayMu.Unlock()
	changed, p.failing = p.failing != v, v
	return changed
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
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
	limit := p.js.Conn().MaxPayload()
	if limit <= 0 {
		limit = transport.MaxPayload // not connected yet: assume the embedded server's limit
	}
	if int64(len(p.body)) > limit-4096 && len(recs) > 1 {
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

// publish sends one batch: straight to JetStream while the spool is empty
// (one attempt), else — or when that attempt fails — into the spool.
// Without a spool it retries until JetStream acks or ctx ends.
func (p *Publisher) publish(ctx context.Context, seq int64, body []byte, records int) error {
	msg := &nats.Msg{Subject: p.subject, Data: body, Header: nats.Header{}}
	id := p.opts.AgentID + "-" + strconv.FormatInt(seq, 10)
	if p.sp == nil {
		return p.publishRetry(ctx, msg, id, body)
	}
	// Only Run appends, so an empty spool stays empty until we append:
	// publishing directly now cannot overtake a spooled batch.
	if p.sp.Empty() && p.js.Conn().IsConnected() {
		err := p.publishOnce(ctx, msg, id, len(body))
		if err == nil {
			return nil
		}
		if ok, n := p.spoolLog.allow(30 * time.Second); ok {
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
		if ok, n := p.lossLog.allow(10 * time.Second); ok {
			p.log.Error("batch lost: NATS unreachable and the spool cannot take it", "msg_id", id, "records", records, "reason", reason,
				"err", err, "lost_batches_not_logged", n, "fix", "raise agent.spool.max_bytes or free disk space; see tapflow_spool_dropped_records_total")
		}
		return fmt.Errorf("publish %s: NATS unreachable and spool refused the batch: %w", id, err)
	}
	p.wake()
	return nil
}

// publishOnce makes one publish attempt bounded by publish_timeout.
func (p *Publisher) publishOnce(ctx context.Context, msg *nats.Msg, id string, n int) error {
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, p.opts.NATS.PublishTimeout.D())
	ack, err := p.js.PublishMsg(pctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(transport.FlowsStream))
	cancel()
	if err != nil {
		p.m.retries.Inc()
		return err
	}
	p.m.latency.Observe(time.Since(start).Seconds())
	p.m.published.Inc()
	p.m.bytes.Add(float64(n))
	if ack.Duplicate {
		p.m.dupes.Inc()
	}
	return nil
}

// publishRetry retries until JetStream acks or ctx (the hard stop) ends.
func (p *Publisher) publishRetry(ctx context.Context, msg *nats.Msg, id string, body []byte) error {
	delay := 100 * time.Millisecond
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		err := p.publishOnce(ctx, msg, id, len(body))
		if err == nil {
			return nil
		}
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

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
