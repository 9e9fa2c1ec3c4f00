// Package consume is the collector's pipeline source: a durable pull
// consumer with explicit acks on TAPFLOW_FLOWS ([New]) or TAPFLOW_METERS
// ([NewMeters]; durable "<durable>-meters"), generic over the record type
// through a [Stream] descriptor. Each message (one agent
// batch) becomes one pipeline.Batch whose ack acks the message — so a
// message is acked only when the sink has made its records durable, and
// nacked (redelivered later) when the sink fails. Messages that do not
// decode are moved to the dead-letter subject with the reason and
// terminated; they never block good messages or crash the collector.
package consume

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

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// Config is the consumer part of the `collector:` section.
type Config struct {
	// Durable is the consumer name; collectors sharing it share the load.
	Durable string `yaml:"durable"`
	// AckWait is how long JetStream waits for an ack before redelivering.
	// It must exceed roll_age: messages are acked when their file commits
	// (default: roll_age + 2m).
	AckWait units.Duration `yaml:"ack_wait"`
	// MaxAckPending bounds unacked messages across the consumer; it must
	// hold at least every message of one open file (default 20000).
	MaxAckPending int `yaml:"max_ack_pending"`
	// FetchBatch is the most messages fetched per pull (default 64).
	FetchBatch int `yaml:"fetch_batch"`
	// NakDelay delays redelivery of a message the sink could not commit
	// (default 5s), so a full disk is not hammered.
	NakDelay units.Duration `yaml:"nak_delay"`
}

// DefaultConfig returns defaults; AckWait is derived from the roll age by
// the caller when left zero.
func DefaultConfig() Config {
	return Config{Durable: "tapflow-collector", MaxAckPending: 20000, FetchBatch: 64, NakDelay: units.Duration(5 * time.Second)}
}

// Validate checks the fields and their fit with the sink's roll age.
func (c Config) Validate(rollAge time.Duration) error {
	var e units.Errors
	if c.Durable == "" {
		e.Add("durable", "empty", "set a consumer name, e.g. tapflow-collector")
	}
	if c.AckWait.D() != 0 && c.AckWait.D() <= rollAge+10*time.Second {
		e.Add("ack_wait", fmt.Sprintf("%s is not longer than roll_age %s + 10s", c.AckWait, rollAge),
			"raise ack_wait (or leave it empty for roll_age + 2m): messages wait for their file to commit before they are acked, a shorter ack_wait causes redelivery storms")
	}
	if c.MaxAckPending < 100 {
		e.Add("max_ack_pending", fmt.Sprintf("%d: too small", c.MaxAckPending), "use at least 100 (default 20000): every message of an open file stays pending until it commits")
	}
	if c.FetchBatch < 1 || c.FetchBatch > 10000 {
		e.Add("fetch_batch", fmt.Sprintf("%d: out of range", c.FetchBatch), "use 1..10000 (default 64)")
	}
	if c.FetchBatch >= 1 && c.MaxAckPending >= 100 && c.FetchBatch*2 > c.MaxAckPending {
		e.Add("max_ack_pending", fmt.Sprintf("%d is less than twice fetch_batch %d", c.MaxAckPending, c.FetchBatch),
			"raise max_ack_pending (default 20000): it must hold the messages of the open files plus a fetch in flight")
	}
	return e.Err()
}

// Stream describes what a source consumes: the stream, its subjects, the
// dead-letter subject, the consumer name suffix and the record decoder.
type Stream[T any] struct {
	Name    string // TAPFLOW_FLOWS
	Filter  string // subject filter: tapflow.flows.v1.>
	DLQ     string // dead-letter subject
	Suffix  string // appended to Config.Durable: "" for flows
	Decoder *schemas.DecoderOf[T]
}

// FlowStream is TAPFLOW_FLOWS with flow.v1 records.
var FlowStream = Stream[schemas.Flow]{
	Name: transport.FlowsStream, Filter: transport.FlowsSubjectRoot + ".>", DLQ: transport.DLQFlowsSubject,
	Decoder: schemas.NewDecoder(),
}

// MeterStream is TAPFLOW_METERS with meter.v1 records; its consumer is
// "<durable>-meters".
var MeterStream = Stream[schemas.Meter]{
	Name: transport.MetersStream, Filter: transport.MetersSubjectRoot + ".>", DLQ: transport.DLQMetersSubject, Suffix: "-meters",
	Decoder: schemas.NewDecoderFor(schemas.MeterTable),
}

// Source is a pipeline.Source reading agent flow batches from JetStream.
type Source = SourceOf[schemas.Flow]

// SourceOf is a pipeline.SourceOf[T] reading agent batches from JetStream.
type SourceOf[T any] struct {
	cfg     Config
	st      Stream[T]
	durable string
	js      jetstream.JetStream
	drain   bool
	drainTO time.Duration
	log     *slog.Logger
	m       metrics

	// held are the messages handed downstream and not yet acked; they
	// get an in-progress ack every AckWait/3 so JetStream never
	// redelivers a message this collector still holds (a file waiting to
	// roll, a full disk, an S3 outage). Only a dead collector's messages
	// are redelivered.
	heldMu     sync.Mutex
	held       map[uint64]jetstream.Msg
	fullLogged time.Time // last max_ack_pending warning (heartbeat goroutine only)
}

type metrics struct {
	messages  prometheus.Counter
	corrupt   prometheus.Counter
	dlqErrors prometheus.Counter
	naks      prometheus.Counter
	pending   prometheus.Gauge
	progress  prometheus.Counter
	heldG     prometheus.Gauge
}

// Options for New.
type Options struct {
	// Drain makes Run, once its context ends, keep consuming until the
	// consumer has nothing pending (bounded by DrainTimeout). `tapflow run`
	// uses it so a graceful stop leaves no batch behind in the stream.
	Drain        bool
	DrainTimeout time.Duration
	Logger       *slog.Logger
	Registry     prometheus.Registerer
}

// New returns the flow source: NewFor(js, FlowStream, cfg, opts).
func New(js jetstream.JetStream, cfg Config, opts Options) (*Source, error) {
	return NewFor(js, FlowStream, cfg, opts)
}

// NewMeters returns the meter source: NewFor(js, MeterStream, cfg, opts).
func NewMeters(js jetstream.JetStream, cfg Config, opts Options) (*SourceOf[schemas.Meter], error) {
	return NewFor(js, MeterStream, cfg, opts)
}

// NewFor validates; it starts nothing. AckWait must already be resolved.
// Metrics are labelled stream=<st.Name>, so sources of several streams
// share a registry.
func NewFor[T any](js jetstream.JetStream, st Stream[T], cfg Config, opts Options) (*SourceOf[T], error) {
	if st.Name == "" || st.Filter == "" || st.DLQ == "" || st.Decoder == nil {
		return nil, fmt.Errorf("jetstream source: incomplete stream description %+v", st)
	}
	if cfg.AckWait.D() <= 0 {
		return nil, errors.New("jetstream source: ack_wait must be resolved before New")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = time.Minute
	}
	durable := cfg.Durable + st.Suffix
	s := &SourceOf[T]{cfg: cfg, st: st, durable: durable, js: js, drain: opts.Drain, drainTO: opts.DrainTimeout,
		log: opts.Logger.With("component", "jetstream-source", "stream", st.Name, "durable", durable), held: map[uint64]jetstream.Msg{}}
	l := prometheus.Labels{"stream": st.Name}
	s.m = metrics{
		messages:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_messages_total", ConstLabels: l, Help: "Messages fetched from the stream."}),
		corrupt:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_corrupt_messages_total", ConstLabels: l, Help: "Messages that failed to decode and went to the dead-letter subject."}),
		dlqErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_dlq_errors_total", ConstLabels: l, Help: "Dead-letter publishes that failed (the message is nacked and retried)."}),
		naks:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_naks_total", ConstLabels: l, Help: "Messages nacked because the sink could not commit them."}),
		pending:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_consume_stream_pending_messages", ConstLabels: l, Help: "Messages in the stream not yet delivered to this consumer."}),
		progress:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_in_progress_acks_total", ConstLabels: l, Help: "In-progress acks sent for held messages (keeps JetStream from redelivering them while their file is open or uploading)."}),
		heldG:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_consume_held_messages", ConstLabels: l, Help: "Messages handed to the sink and not yet acked (bounded by max_ack_pending)."}),
	}
	if opts.Registry != nil {
		opts.Registry.MustRegister(s.m.messages, s.m.corrupt, s.m.dlqErrors, s.m.naks, s.m.pending, s.m.progress, s.m.heldG)
	}
	return s, nil
}

// Name implements pipeline.Source.
func (s *SourceOf[T]) Name() string { return "consume" }

// Consumer creates or updates the durable consumer (idempotent).
func (s *SourceOf[T]) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := s.js.CreateOrUpdateConsumer(cctx, s.st.Name, jetstream.ConsumerConfig{
		Durable:       s.durable,
		Description:   "tapflow collector: Parquet writer, acks after file commit",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait.D(),
		MaxAckPending: s.cfg.MaxAckPending,
		FilterSubject: s.st.Filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on %s: %w", s.durable, s.st.Name, err)
	}
	return c, nil
}

// Run implements pipeline.Source. While it runs, and afterwards until
// every message it forwarded is acked or nacked, held messages get an
// in-progress ack every AckWait/3.
func (s *SourceOf[T]) Run(ctx context.Context, out chan<- *pipeline.BatchOf[T]) error {
	hbDone := make(chan struct{})
	defer close(hbDone)
	go s.heartbeat(hbDone)
	var cons jetstream.Consumer
	delay := time.Second
	for {
		var err error
		if cons, err = s.consumer(ctx); err == nil {
			break
		}
		s.log.Warn("consumer not ready; retrying", "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(delay*2, 30*time.Second)
	}
	for ctx.Err() == nil {
		s.fetch(ctx, cons, out, time.Second)
	}
	if !s.drain {
		return nil
	}
	// Drain: the agents have stopped; consume what they left in the stream.
	deadline := time.Now().Add(s.drainTO)
	bg := context.Background()
	for time.Now().Before(deadline) {
		n := s.fetch(bg, cons, out, 200*time.Millisecond)
		if n > 0 {
			continue
		}
		ictx, cancel := context.WithTimeout(bg, 5*time.Second)
		info, err := cons.Info(ictx)
		cancel()
		if err != nil || info.NumPending == 0 {
			break
		}
	}
	return nil
}

// fetch pulls one round of messages and forwards them; it returns how many
// it got.
func (s *SourceOf[T]) fetch(ctx context.Context, cons jetstream.Consumer, out chan<- *pipeline.BatchOf[T], wait time.Duration) int {
	batch, err := cons.Fetch(s.cfg.FetchBatch, jetstream.FetchMaxWait(wait))
	if err != nil {
		s.log.Warn("fetch failed", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		return 0
	}
	n := 0
	for msg := range batch.Messages() {
		n++
		s.m.messages.Inc()
		if md, err := msg.Metadata(); err == nil {
			s.m.pending.Set(float64(md.NumPending))
			s.forward(msg, md, out)
		} else {
			s.deadLetter(msg, 0, fmt.Errorf("no JetStream metadata: %w", err))
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		s.log.Debug("fetch ended", "err", err)
	}
	return n
}

func (s *SourceOf[T]) forward(msg jetstream.Msg, md *jetstream.MsgMetadata, out chan<- *pipeline.BatchOf[T]) {
	recs, err := s.st.Decoder.Decode(nil, msg.Data())
	if err != nil {
		s.deadLetter(msg, md.Sequence.Stream, err)
		return
	}
	seq := md.Sequence.Stream
	s.heldMu.Lock()
	s.held[seq] = msg
	s.m.heldG.Set(float64(len(s.held)))
	s.heldMu.Unlock()
	b := pipeline.NewBatchOf(recs, func(err error) {
		s.heldMu.Lock()
		delete(s.held, seq)
		s.m.heldG.Set(float64(len(s.held)))
		s.heldMu.Unlock()
		if err == nil {
			if aerr := msg.Ack(); aerr != nil {
				// The file is committed; a lost ack means a redelivery the
				// collector's dedupe must absorb.
				s.log.Warn("ack failed after commit", "seq", md.Sequence.Stream, "err", aerr)
			}
			return
		}
		s.m.naks.Inc()
		_ = msg.NakWithDelay(s.cfg.NakDelay.D())
	})
	b.Seq = int64(md.Sequence.Stream)
	b.Created = md.Timestamp
	out <- b // blocking: backpressure
}

// heartbeat sends in-progress acks for held messages every AckWait/3
// until runDone is closed and nothing is held any more.
func (s *SourceOf[T]) heartbeat(runDone <-chan struct{}) {
	every := max(s.cfg.AckWait.D()/3, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	finished := false
	for {
		select {
		case <-runDone:
			finished, runDone = true, nil
		case <-t.C:
		}
		s.heldMu.Lock()
		msgs := make([]jetstream.Msg, 0, len(s.held))
		for _, m := range s.held {
			msgs = append(msgs, m)
		}
		s.heldMu.Unlock()
		if finished && len(msgs) == 0 {
			return
		}
		if len(msgs) >= s.cfg.MaxAckPending && time.Since(s.fullLogged) > time.Minute {
			s.fullLogged = time.Now()
			s.log.Warn("max_ack_pending reached: JetStream delivers nothing more until a file commits, so files roll by age, not size",
				"held", len(msgs), "max_ack_pending", s.cfg.MaxAckPending,
				"fix", "raise collector.max_ack_pending above the messages one roll holds (roll_size / bytes per agent batch), or lower collector.roll_size")
		}
		for _, m := range msgs {
			if err := m.InProgress(); err == nil {
				s.m.progress.Inc()
			}
		}
	}
}

// deadLetter republishes the raw message with the reason and terminates the
// original. If the dead-letter publish fails, the original is nacked so it
// is retried: never lost.
func (s *SourceOf[T]) deadLetter(msg jetstream.Msg, seq uint64, cause error) {
	s.m.corrupt.Inc()
	s.log.Error("corrupt message moved to dead-letter subject", "subject", msg.Subject(), "stream_seq", seq, "bytes", len(msg.Data()), "dlq", s.st.DLQ, "err", cause)
	dl := &nats.Msg{Subject: s.st.DLQ, Data: msg.Data(), Header: nats.Header{}}
	dl.Header.Set(transport.HeaderOrigSubject, msg.Subject())
	dl.Header.Set(transport.HeaderOrigSeq, strconv.FormatUint(seq, 10))
	dl.Header.Set(transport.HeaderError, cause.Error())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.js.PublishMsg(ctx, dl, jetstream.WithMsgID("dlq-"+s.st.Name+"-"+strconv.FormatUint(seq, 10))); err != nil {
		s.m.dlqErrors.Inc()
		s.log.Error("dead-letter publish failed; message nacked for retry", "stream_seq", seq, "err", err)
		_ = msg.NakWithDelay(s.cfg.NakDelay.D())
		return
	}
	_ = msg.TermWithReason("tapflow: corrupt batch: " + cause.Error())
}
