// Package consume is the collector's pipeline source: a durable pull
// consumer with explicit acks on TAPFLOW_FLOWS ([New]) or TAPFLOW_METERS
// ([NewMeters]; durable "<durable>-meters"), generic over the record type
// through a [Stream] descriptor. Each message (one agent
// batch) becomes one pipeline.Batch whose ack acks the message — so a
// message is acked only when the sink has made its records durable, and
// nacked (redelivered later) when the sink fails. Before a message goes
// downstream it is checked (check.go: size while decoding, identity,
// time); a message that fails is moved whole to the dead-letter subject
// with its reason and terminated, so it never blocks good messages,
// crashes the collector or opens a bogus partition.
package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
	// MaxBatchRecords is the most records one message may carry
	// (default 1048576); more goes to the DLQ (reason size).
	MaxBatchRecords int `yaml:"max_batch_records"`
	// MaxMessageBytes caps what one message may decode to — its zstd
	// frame decompressed, its Arrow buffers expanded (default 64MiB);
	// checked while decoding, so a compression bomb cannot exhaust memory.
	MaxMessageBytes units.ByteSize `yaml:"max_message_bytes"`
	// MaxRecordAge: a record whose time_end is older sends its message to
	// the DLQ (reason time; default 168h). It must exceed the longest
	// NATS outage an agent spool bridges.
	MaxRecordAge units.Duration `yaml:"max_record_age"`
	// MaxClockSkew: a record whose time_end is further ahead of the
	// collector's clock sends its message to the DLQ (reason time;
	// default 1h).
	MaxClockSkew units.Duration `yaml:"max_clock_skew"`
	// AgentIDIsNode rejects (reason identity) a message whose records'
	// agent_id is not the subject's node: with per-node publish
	// permissions, no agent can then claim another agent's batches
	// (docs/security.md). Default true: without it, a credentialed agent
	// can burn another agent's (agent_id, batch_seq) and the sink's
	// batch ledger skips the real batch. Needs agent.id left at its
	// default (the node); false only for a fleet that sets agent.id.
	AgentIDIsNode bool `yaml:"agent_id_is_node"`
	// PoisonDeliveries: a message delivered more than this many times,
	// whose decoding this collector's process died in before (poison.go),
	// goes to the DLQ (reason poison) before it is decoded again: no
	// crash loop. Default 5; 2..100. Every delivery past the first of a
	// message the process dies on costs an ack_wait (the dead process's
	// delivery must expire), so a small value ends a crash loop sooner;
	// healthy redeliveries (collector restarts, ack_wait expiries, sink
	// failures nacked every nak_delay) raise the count too but are never
	// recorded as the message the process died decoding.
	PoisonDeliveries int `yaml:"poison_deliveries"`
	// DLQLettersPerNode bounds the dead letters one sender (the node of
	// the subject it published on) holds in TAPFLOW_DLQ: beyond it the
	// sender's own oldest letter is deleted, counted
	// (tapflow_consume_dlq_evictions_total) and tallied for `tapflow dlq
	// inspect`, so one agent's garbage cannot evict another's letters.
	// Default 100; 1..100000 (dlq.go).
	DLQLettersPerNode int `yaml:"dlq_letters_per_node"`
	// EarlyCommitShare: once the messages the collectors sharing the
	// durable hold unacked (those of their open files) reach this share
	// of the stream's max_bytes or max_msgs, or of max_ack_pending, the
	// collector commits its open files early instead of waiting for
	// roll_size or roll_age (pressure.go). Default 0.5; 0.05..0.95. A
	// stream smaller than roll_age × the rate then costs smaller files,
	// never refused publishes.
	EarlyCommitShare float64 `yaml:"early_commit_share"`
}

// Default limits of one message.
const (
	DefaultMaxBatchRecords  = 1 << 20
	DefaultMaxMessageBytes  = 64 << 20
	DefaultMaxRecordAge     = 7 * 24 * time.Hour
	DefaultMaxClockSkew     = time.Hour
	DefaultPoisonDeliveries = 5
	// DefaultDLQLettersPerNode: at the embedded server's 8 MiB max
	// payload a flooding sender holds at most 800 MiB, leaving the rest
	// of the default 1 GiB DLQ to the others (docs/delivery.md).
	DefaultDLQLettersPerNode = 100
	maxRecordAgeCap          = 365 * 24 * time.Hour
	maxClockSkewCap          = 7 * 24 * time.Hour
	// maxMessageBytesCap is the decoder's hard ceiling.
	maxMessageBytesCap = 512 << 20
)

// DefaultConfig returns defaults; AckWait is derived from the roll age by
// the caller when left zero.
func DefaultConfig() Config {
	return Config{Durable: transport.DefaultDurable, MaxAckPending: transport.DefaultMaxAckPending, FetchBatch: 64, NakDelay: units.Duration(5 * time.Second),
		MaxBatchRecords: DefaultMaxBatchRecords, MaxMessageBytes: DefaultMaxMessageBytes,
		MaxRecordAge: units.Duration(DefaultMaxRecordAge), MaxClockSkew: units.Duration(DefaultMaxClockSkew),
		AgentIDIsNode: true, PoisonDeliveries: DefaultPoisonDeliveries, DLQLettersPerNode: DefaultDLQLettersPerNode,
		EarlyCommitShare: DefaultEarlyCommitShare}
}

// withDefaults fills limits left zero by a caller that built Config by
// hand; Validate refuses zero in a config file.
func (c Config) withDefaults() Config {
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxRecordAge == 0 {
		c.MaxRecordAge = units.Duration(DefaultMaxRecordAge)
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = units.Duration(DefaultMaxClockSkew)
	}
	if c.PoisonDeliveries == 0 {
		c.PoisonDeliveries = DefaultPoisonDeliveries
	}
	if c.DLQLettersPerNode == 0 {
		c.DLQLettersPerNode = DefaultDLQLettersPerNode
	}
	if c.EarlyCommitShare == 0 {
		c.EarlyCommitShare = DefaultEarlyCommitShare
	}
	return c
}

func (c Config) limits() Limits {
	return Limits{MaxRecords: c.MaxBatchRecords, MaxRecordAge: c.MaxRecordAge.D(), MaxClockSkew: c.MaxClockSkew.D(), AgentIDIsNode: c.AgentIDIsNode}
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
	if c.MaxBatchRecords < 1 || c.MaxBatchRecords > 1<<24 {
		e.Add("max_batch_records", fmt.Sprintf("%d: out of range", c.MaxBatchRecords),
			"use 1..16777216 (default 1048576), at least the agents' batch size (synthetic.batch_records, capture batches)")
	}
	if c.MaxMessageBytes < 1<<20 || c.MaxMessageBytes > maxMessageBytesCap {
		e.Add("max_message_bytes", fmt.Sprintf("%s: out of range", c.MaxMessageBytes),
			"use 1MiB..512MiB (default 64MiB): it bounds the memory one message may take, and must hold the largest agent batch decompressed (about 4x the server's max_payload with zstd)")
	}
	if c.MaxRecordAge.D() < time.Hour {
		e.Add("max_record_age", fmt.Sprintf("%s: too short", c.MaxRecordAge),
			"use at least 1h (default 168h): it must exceed the longest NATS outage an agent spool bridges, or replayed batches are dead-lettered")
	}
	// The upper bounds keep every accepted time_end inside the Parquet
	// sink's partition range (years 2000..2199): a batch the sink refused
	// after this check passed would be nacked and redelivered forever
	// instead of going to the DLQ.
	if c.MaxRecordAge.D() > maxRecordAgeCap {
		e.Add("max_record_age", fmt.Sprintf("%s: too long", c.MaxRecordAge), "use at most 8760h (365 days; default 168h)")
	}
	if c.MaxClockSkew.D() < time.Second {
		e.Add("max_clock_skew", fmt.Sprintf("%s: too short", c.MaxClockSkew), "use at least 1s (default 1h)")
	}
	if c.MaxClockSkew.D() > maxClockSkewCap {
		e.Add("max_clock_skew", fmt.Sprintf("%s: too long", c.MaxClockSkew), "use at most 168h (default 1h)")
	}
	if c.PoisonDeliveries < 2 || c.PoisonDeliveries > 100 {
		e.Add("poison_deliveries", fmt.Sprintf("%d: out of range", c.PoisonDeliveries),
			"use 2..100 (default 5): a message the collector died decoding is dead-lettered once delivered more often; each further delivery costs one ack_wait of crash loop")
	}
	if c.DLQLettersPerNode < 1 || c.DLQLettersPerNode > 100000 {
		e.Add("dlq_letters_per_node", fmt.Sprintf("%d: out of range", c.DLQLettersPerNode),
			"use 1..100000 (default 100): the dead letters one node may hold in TAPFLOW_DLQ before its own oldest is evicted; times the server's max_payload it should stay well below nats.dlq_max_bytes")
	}
	if c.EarlyCommitShare < 0.05 || c.EarlyCommitShare > 0.95 {
		e.Add("early_commit_share", fmt.Sprintf("%g: out of range", c.EarlyCommitShare),
			"use 0.05..0.95 (default 0.5): the share of the stream (and of max_ack_pending) the collectors may hold unacked before they commit their open files early")
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
	// Identity reads the fields the per-message checks need.
	Identity func(*T) Identity
}

// FlowStream is TAPFLOW_FLOWS with flow.v1 records.
var FlowStream = Stream[schemas.Flow]{
	Name: transport.FlowsStream, Filter: transport.FlowsSubjectRoot + ".>", DLQ: transport.DLQFlowsSubject,
	Decoder: schemas.NewDecoder(),
	Identity: func(r *schemas.Flow) Identity {
		return Identity{Node: r.Node, AgentID: r.AgentID, BatchSeq: r.BatchSeq, RecordIndex: r.RecordIndex, TimeEnd: r.TimeEnd}
	},
}

// MeterStream is TAPFLOW_METERS with meter.v1 records; its consumer is
// "<durable>-meters".
var MeterStream = Stream[schemas.Meter]{
	Name: transport.MetersStream, Filter: transport.MetersSubjectRoot + ".>", DLQ: transport.DLQMetersSubject, Suffix: transport.MetersDurableSuffix,
	Decoder: schemas.NewDecoderFor(schemas.MeterTable),
	Identity: func(r *schemas.Meter) Identity {
		return Identity{Node: r.Node, AgentID: r.AgentID, BatchSeq: r.BatchSeq, RecordIndex: r.RecordIndex, TimeEnd: r.TimeEnd}
	},
}

// FlowRowStream is TAPFLOW_FLOWS decoded into schemas.Row (the records
// stay in their Arrow columns): the collector's form, for
// parquet.FlowRowSchema.
var FlowRowStream = rowStream(FlowStream, schemas.FlowRows)

// MeterRowStream is TAPFLOW_METERS decoded into schemas.Row.
var MeterRowStream = rowStream(MeterStream, schemas.MeterRows)

func rowStream[T any](like Stream[T], t *schemas.Table[schemas.Row]) Stream[schemas.Row] {
	return Stream[schemas.Row]{
		Name: like.Name, Filter: like.Filter, DLQ: like.DLQ, Suffix: like.Suffix,
		Decoder: schemas.NewDecoderFor(t),
		Identity: func(r *schemas.Row) Identity {
			return Identity{Node: r.Node(), AgentID: r.AgentID(), BatchSeq: r.BatchSeq(), RecordIndex: r.RecordIndex(), TimeEnd: r.TimeEnd()}
		},
	}
}

// Source is a pipeline.Source reading agent flow batches from JetStream.
type Source = SourceOf[schemas.Flow]

// SourceOf is a pipeline.SourceOf[T] reading agent batches from JetStream.
type SourceOf[T any] struct {
	cfg     Config
	st      Stream[T]
	dec     *schemas.DecoderOf[T] // st.Decoder limited to max_message_bytes / max_batch_records, pooled
	pool    *schemas.BufferPool
	lim     Limits
	now     func() time.Time
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
	held       map[uint64]*ackHandle
	fullLogged time.Time                     // last max_ack_pending warning (heartbeat goroutine only)
	rejectLog  map[string]*transport.RateLog // one line per reason per 10 s: a hostile flood cannot flood the log

	evictLog transport.RateLog
	dlqMu    sync.Mutex
	dlqSt    jetstream.Stream // TAPFLOW_DLQ, once looked up (dlq.go)

	stateDir string  // poison marker directory; "" disables poison detection
	marker   *marker // open while Run runs (fetch goroutine only)

	heldBytes  int64 // stream size of the held messages (heldMu)
	press      pressure
	pressEvery time.Duration
	earlyLog   transport.RateLog
}

type metrics struct {
	messages  prometheus.Counter
	corrupt   prometheus.Counter
	rejected  *prometheus.CounterVec // by reason
	poison    prometheus.Counter
	dlqErrors prometheus.Counter
	evicted   prometheus.Counter
	naks      prometheus.Counter
	pending   prometheus.Gauge
	progress  prometheus.Counter
	heldG     prometheus.Gauge
	heldBytes prometheus.Gauge
	early     *prometheus.CounterVec // by reason
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
	// Now is the clock of the time check (default time.Now).
	Now func() time.Time
	// StateDir holds the poison marker (poison.go), one small file per
	// stream: the collector's <data_dir>/consume. Empty disables poison
	// detection.
	StateDir string
	// PressureInterval is how often the stream's limits and the durable's
	// held total are polled for early commits (default 1s).
	PressureInterval time.Duration
	// DecodePool recycles the Arrow buffers of the row sources' decoded
	// messages (NewRows, NewMeterRows): they go back once the sink (or
	// the dead-letter path) calls schemas.ReleaseRows. Nil: a pool of
	// DefaultDecodePoolBytes of its own. Record sources ignore it.
	DecodePool *schemas.BufferPool
}

// DefaultDecodePoolBytes caps the idle buffers a row source keeps for
// the next messages: enough for the messages between the fetch and the
// sink (the runner's edges) at agent batch sizes; larger messages are
// allocated and left to the GC beyond it.
const DefaultDecodePoolBytes = 32 << 20

// New returns the flow source: NewFor(js, FlowStream, cfg, opts).
func New(js jetstream.JetStream, cfg Config, opts Options) (*Source, error) {
	return NewFor(js, FlowStream, cfg, opts)
}

// NewMeters returns the meter source: NewFor(js, MeterStream, cfg, opts).
func NewMeters(js jetstream.JetStream, cfg Config, opts Options) (*SourceOf[schemas.Meter], error) {
	return NewFor(js, MeterStream, cfg, opts)
}

// NewRows returns the columnar flow source: NewFor(js, FlowRowStream,
// cfg, opts).
func NewRows(js jetstream.JetStream, cfg Config, opts Options) (*SourceOf[schemas.Row], error) {
	return NewFor(js, FlowRowStream, cfg, opts)
}

// NewMeterRows returns the columnar meter source: NewFor(js,
// MeterRowStream, cfg, opts).
func NewMeterRows(js jetstream.JetStream, cfg Config, opts Options) (*SourceOf[schemas.Row], error) {
	return NewFor(js, MeterRowStream, cfg, opts)
}

// NewFor validates; it starts nothing. AckWait must already be resolved.
// Metrics are labelled stream=<st.Name>, so sources of several streams
// share a registry.
func NewFor[T any](js jetstream.JetStream, st Stream[T], cfg Config, opts Options) (*SourceOf[T], error) {
	if st.Name == "" || st.Filter == "" || st.DLQ == "" || st.Decoder == nil || st.Identity == nil {
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
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PressureInterval <= 0 {
		opts.PressureInterval = defaultPressureInterval
	}
	cfg = cfg.withDefaults()
	if cfg.MaxMessageBytes > maxMessageBytesCap {
		return nil, fmt.Errorf("jetstream source: max_message_bytes %s above %s", cfg.MaxMessageBytes, units.ByteSize(maxMessageBytesCap))
	}
	dec, err := st.Decoder.Limited(int64(cfg.MaxMessageBytes), cfg.MaxBatchRecords)
	if err != nil {
		return nil, fmt.Errorf("jetstream source: %w", err)
	}
	pool := opts.DecodePool
	if pool == nil {
		pool = schemas.NewBufferPool(DefaultDecodePoolBytes)
	}
	dec = dec.WithPool(pool)
	durable := cfg.Durable + st.Suffix
	s := &SourceOf[T]{cfg: cfg, st: st, dec: dec, pool: pool, lim: cfg.limits(), now: opts.Now, durable: durable, js: js, drain: opts.Drain, drainTO: opts.DrainTimeout,
		log: opts.Logger.With("component", "jetstream-source", "stream", st.Name, "durable", durable), held: map[uint64]*ackHandle{}, stateDir: opts.StateDir,
		pressEvery: opts.PressureInterval}
	l := prometheus.Labels{"stream": st.Name}
	s.m = metrics{
		messages: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_messages_total", ConstLabels: l, Help: "Messages fetched from the stream."}),
		corrupt:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_corrupt_messages_total", ConstLabels: l, Help: "Messages that failed to decode (reasons decode and size) and went to the dead-letter subject."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_consume_rejected_messages_total", ConstLabels: l,
			Help: "Messages moved to the dead-letter subject, by reason: poison, decode, size, identity, time."}, []string{"reason"}),
		poison: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_poison_total", ConstLabels: l,
			Help: "Messages dead-lettered undecoded (reason poison): delivered more than collector.poison_deliveries times, and this collector's process died decoding them before."}),
		dlqErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_dlq_errors_total", ConstLabels: l, Help: "Dead-letter publishes that failed (the message is nacked and retried)."}),
		naks:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_naks_total", ConstLabels: l, Help: "Messages nacked because the sink could not commit them."}),
		pending:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_consume_stream_pending_messages", ConstLabels: l, Help: "Messages in the stream not yet delivered to this consumer."}),
		progress:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_in_progress_acks_total", ConstLabels: l, Help: "In-progress acks sent for held messages (keeps JetStream from redelivering them while their file is open or uploading)."}),
		heldG:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_consume_held_messages", ConstLabels: l, Help: "Messages handed to the sink and not yet acked (bounded by max_ack_pending)."}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_consume_dlq_evictions_total", ConstLabels: l,
			Help: "Dead letters deleted from TAPFLOW_DLQ because their sender held more than collector.dlq_letters_per_node (its own oldest first); per sender: tapflow dlq inspect."}),
		heldBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_consume_held_bytes", ConstLabels: l, Help: "Stream bytes of the messages handed to the sink and not yet acked (they stay in the stream until their files commit)."}),
		early: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_consume_early_commits_total", ConstLabels: l,
			Help: "Commits of the open Parquet files before roll_size or roll_age, by reason: the messages the durable's collectors hold unacked reached collector.early_commit_share of the stream's max_bytes (stream_bytes) or max_msgs (stream_msgs), or of max_ack_pending (ack_pending). Continuous early commits: the stream is undersized for roll_age."}, []string{"reason"}),
	}
	if opts.Registry != nil {
		for _, c := range append([]prometheus.Collector{s.m.messages, s.m.corrupt, s.m.rejected, s.m.poison, s.m.dlqErrors, s.m.evicted, s.m.naks, s.m.pending, s.m.progress, s.m.heldG, s.m.heldBytes, s.m.early}, poolMetrics(pool, l)...) {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("jetstream source %s: register metrics: %w", st.Name, err)
			}
		}
	}
	s.rejectLog = make(map[string]*transport.RateLog, len(Reasons))
	for _, r := range Reasons {
		s.rejectLog[r] = new(transport.RateLog)
		s.m.rejected.WithLabelValues(r) // exist at 0 so rate() alerts work
	}
	for _, r := range EarlyReasons {
		s.m.early.WithLabelValues(r)
	}
	return s, nil
}

// Name implements pipeline.Source.
func (s *SourceOf[T]) Name() string { return "consume" }

// Consumer creates or updates the durable consumer (idempotent).
func (s *SourceOf[T]) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The same config EnsureStreams creates the consumer with before
	// agents publish (interest retention).
	c, err := s.js.CreateOrUpdateConsumer(cctx, s.st.Name,
		transport.CollectorConsumerConfig(s.durable, s.st.Filter, s.cfg.AckWait.D(), s.cfg.MaxAckPending))
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on %s: %w", s.durable, s.st.Name, err)
	}
	return c, nil
}

// Run implements pipeline.Source. While it runs, and afterwards until
// every message it forwarded is acked or nacked, held messages get an
// in-progress ack every AckWait/3.
func (s *SourceOf[T]) Run(ctx context.Context, out chan<- *pipeline.BatchOf[T]) error {
	if s.stateDir != "" {
		m, died, err := openMarker(s.stateDir, s.st.Name)
		if err != nil {
			return fmt.Errorf("jetstream source %s: %w; fix: make the collector's data_dir writable", s.st.Name, err)
		}
		defer m.close()
		s.marker = m
		if died != 0 {
			s.log.Warn("the previous collector process died while decoding a message; it goes to the dead-letter subject (reason poison) once delivered more than collector.poison_deliveries times",
				"stream_seq", died, "poison_deliveries", s.cfg.PoisonDeliveries)
		}
	}
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
	pollDone := make(chan struct{})
	defer close(pollDone)
	go s.pollPressure(pollDone, cons)
	if mp := s.js.Conn().MaxPayload(); mp*4 > int64(s.cfg.MaxMessageBytes) {
		s.log.Warn("the server's max_payload lets agents send messages that may decompress beyond collector.max_message_bytes; they would be dead-lettered (reason size)",
			"max_payload", units.ByteSize(mp), "max_message_bytes", s.cfg.MaxMessageBytes, "fix", "raise collector.max_message_bytes to about 4x max_payload")
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
			s.deadLetter(msg, 0, ReasonDecode, fmt.Errorf("no JetStream metadata: %w", err))
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		s.log.Debug("fetch ended", "err", err)
	}
	return n
}

func (s *SourceOf[T]) forward(msg jetstream.Msg, md *jetstream.MsgMetadata, out chan<- *pipeline.BatchOf[T]) {
	seq := md.Sequence.Stream
	if s.marker != nil && md.NumDelivered > 1 {
		// Before the body is touched: a message the process died on
		// must not be decoded again.
		if md.NumDelivered > uint64(s.cfg.PoisonDeliveries) && s.marker.culprit(seq) {
			s.poisoned(msg, md)
			return
		}
		if err := s.marker.set(seq); err != nil {
			s.log.Warn("poison marker not written; a crash on this message would not be recognised", "stream_seq", seq, "err", err)
		}
		defer func() {
			if err := s.marker.set(0); err != nil {
				s.log.Warn("poison marker not cleared", "stream_seq", seq, "err", err)
			}
		}()
	}
	if n := len(msg.Data()); int64(n) > int64(s.cfg.MaxMessageBytes) {
		s.deadLetter(msg, seq, ReasonSize, fmt.Errorf("%d bytes, more than collector.max_message_bytes %s", n, s.cfg.MaxMessageBytes))
		return
	}
	if len(msg.Data()) == 0 {
		s.deadLetter(msg, seq, ReasonEmpty, fmt.Errorf("empty body under Nats-Msg-Id %q: an agent never publishes an empty batch; acked, it would burn that id for its owner within the duplicate window", msg.Headers().Get(jetstream.MsgIDHeader)))
		return
	}
	failpointDecode(s.log, msg.Headers().Get(jetstream.MsgIDHeader))
	recs, err := s.dec.Decode(nil, msg.Data())
	if err != nil {
		reason := ReasonDecode
		if errors.Is(err, schemas.ErrTooLarge) {
			reason, err = ReasonSize, fmt.Errorf("%w (collector.max_message_bytes %s, max_batch_records %d)", err, s.cfg.MaxMessageBytes, s.cfg.MaxBatchRecords)
		}
		s.deadLetter(msg, seq, reason, err)
		return
	}
	if rej := Check(recs, s.st.Identity, msg.Subject(), msg.Headers().Get(jetstream.MsgIDHeader), s.now(), s.lim); rej != nil {
		s.deadLetter(msg, seq, rej.Reason, rej.Err) // the letter is msg's own body, never the decoded buffers
		release(recs)
		return
	}
	if rej := CheckHeaders(msg.Headers(), s.st.Identity(&recs[0]), len(recs)); rej != nil {
		s.deadLetter(msg, seq, rej.Reason, rej.Err)
		release(recs)
		return
	}
	// From here on only the ack handle refers to the message: its payload
	// is garbage once decoded, though the ack waits for the file commit.
	h := newAckHandle(s.js.Conn(), msg.Reply())
	size := messageSize(msg)
	s.heldMu.Lock()
	if old := s.held[seq]; old != nil {
		s.heldBytes -= old.size // a redelivery of a message still held
	}
	h.size = size
	s.held[seq] = h
	s.heldBytes += size
	s.m.heldG.Set(float64(len(s.held)))
	s.m.heldBytes.Set(float64(s.heldBytes))
	s.heldMu.Unlock()
	b := pipeline.NewBatchOf(recs, func(err error) {
		s.heldMu.Lock()
		if s.held[seq] == h {
			delete(s.held, seq)
			s.heldBytes -= size
		}
		s.m.heldG.Set(float64(len(s.held)))
		s.m.heldBytes.Set(float64(s.heldBytes))
		s.heldMu.Unlock()
		if err == nil {
			if aerr := h.ack(); aerr != nil {
				// The file is committed; a lost ack means a redelivery the
				// collector's dedupe must absorb.
				s.log.Warn("ack failed after commit", "seq", seq, "err", aerr)
			}
			return
		}
		s.m.naks.Inc()
		_ = h.nakWithDelay(s.cfg.NakDelay.D())
	})
	b.Seq = int64(md.Sequence.Stream)
	b.Created = md.Timestamp
	out <- b // blocking: backpressure
}

// poisoned dead-letters a message the process died decoding, undecoded,
// with one log line per message: poison is rare (each one took several
// collector deaths), so every one is worth a line.
func (s *SourceOf[T]) poisoned(msg jetstream.Msg, md *jetstream.MsgMetadata) {
	seq := md.Sequence.Stream
	id := msg.Headers().Get(jetstream.MsgIDHeader)
	agent := id
	if i := strings.LastIndexByte(id, '-'); i > 0 {
		agent = id[:i] // <agent_id>-<batch_seq>, as the agent stamps it
	}
	s.m.poison.Inc()
	// It stays a suspect: should the dead-letter publish fail, the nacked
	// message must not be decoded at its next delivery either.
	s.log.Error("poison message: the collector process died decoding it before; moved undecoded to the dead-letter subject",
		"stream_seq", seq, "msg_id", id, "agent", agent, "subject", msg.Subject(), "deliveries", md.NumDelivered,
		"poison_deliveries", s.cfg.PoisonDeliveries, "bytes", len(msg.Data()), "dlq", transport.DLQSubject(s.st.DLQ, msg.Subject()),
		"inspect", "tapflow dlq inspect --reason "+ReasonPoison)
	s.deadLetter(msg, seq, ReasonPoison, fmt.Errorf("delivered %d times (collector.poison_deliveries %d); a collector process died decoding it", md.NumDelivered, s.cfg.PoisonDeliveries))
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
		msgs := make([]*ackHandle, 0, len(s.held))
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
			if err := m.inProgress(); err == nil {
				s.m.progress.Inc()
			}
		}
	}
}

// deadLetter republishes the raw message — body and original headers —
// to the dead-letter subject with the reason, and terminates the
// original. If the dead-letter publish fails, the original is nacked so it
// is retried: never lost.
func (s *SourceOf[T]) deadLetter(msg jetstream.Msg, seq uint64, reason string, cause error) {
	s.m.rejected.WithLabelValues(reason).Inc()
	if reason == ReasonDecode || reason == ReasonSize {
		s.m.corrupt.Inc()
	}
	if ok, suppressed := s.rejectLog[reason].Allow(10 * time.Second); ok && reason != ReasonPoison { // poisoned logged it
		s.log.Error("message rejected and moved to the dead-letter subject", "reason", reason, "subject", msg.Subject(), "stream_seq", seq,
			"bytes", len(msg.Data()), "dlq", transport.DLQSubject(s.st.DLQ, msg.Subject()), "err", cause, "inspect", "tapflow dlq inspect --reason "+reason,
			"rejections_not_logged", suppressed)
	}
	dl := &nats.Msg{Subject: transport.DLQSubject(s.st.DLQ, msg.Subject()), Data: msg.Data(), Header: nats.Header{}}
	for k, v := range msg.Headers() {
		// Nats-* are JetStream's own (message id, expected stream…): they
		// would steer the DLQ publish; the original id is kept below.
		if !strings.HasPrefix(k, "Nats-") {
			dl.Header[k] = v
		}
	}
	dl.Header.Set(transport.HeaderOrigSubject, msg.Subject())
	dl.Header.Set(transport.HeaderOrigSeq, strconv.FormatUint(seq, 10))
	dl.Header.Set(transport.HeaderOrigStream, s.st.Name)
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		dl.Header.Set(transport.HeaderOrigMsgID, id)
	}
	dl.Header.Set(transport.HeaderReason, reason)
	dl.Header.Set(transport.HeaderError, cause.Error())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.js.PublishMsg(ctx, dl, jetstream.WithMsgID("dlq-"+s.st.Name+"-"+strconv.FormatUint(seq, 10))); err != nil {
		s.m.dlqErrors.Inc()
		fix := "check NATS permissions on " + transport.DLQSubjectRoot + ".>"
		if strings.Contains(err.Error(), "maximum bytes") {
			fix = "TAPFLOW_DLQ is full (nats.dlq_max_bytes): inspect, replay or purge dead letters (tapflow dlq inspect), or raise nats.dlq_max_bytes"
		}
		s.log.Error("dead-letter publish failed; message nacked for retry", "stream_seq", seq, "dlq", dl.Subject, "err", err, "fix", fix)
		_ = msg.NakWithDelay(s.cfg.NakDelay.D())
		return
	}
	_ = transport.Term(s.js.Conn(), msg, "tapflow: rejected ("+reason+"): "+cause.Error())
	s.trimDLQ(dl.Subject)
}
