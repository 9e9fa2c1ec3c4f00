package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// BacklogOptions configure a BacklogMonitor.
type BacklogOptions struct {
	// Interval between polls (default 5s).
	Interval time.Duration
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// BacklogMonitor exports the backlog of the tapflow streams: messages and
// bytes held (with interest retention: not yet acked by every consumer),
// the stream's max_bytes, and per consumer what it has not received yet
// and what it holds unacked. It polls StreamInfo and ConsumerInfo; the
// gauges of the streams and of the collector's consumers exist from
// construction, other consumers (subscribers) appear when seen and go
// when the server deletes them.
type BacklogMonitor struct {
	js       jetstream.JetStream
	streams  []jetstream.StreamConfig
	known    map[string]string // stream -> collector durable
	interval time.Duration
	log      *slog.Logger

	msgs, bytes, maxBytes *prometheus.GaugeVec
	pending, ackPending   *prometheus.GaugeVec
	pollErrors            prometheus.Counter

	seen     map[string]map[string]bool // stream -> consumers exported by the last poll
	fullWarn map[string]time.Time       // stream -> last "nearly full" log
	errLog   time.Time
}

// backlogFullWarn is the share of max_bytes at which a backlog is logged
// as nearly full.
const backlogFullWarn = 0.9

// NewBacklogMonitor validates and registers the gauges for the streams
// cfg defines and the collector's consumers (cfg.Collector); it starts
// nothing.
func NewBacklogMonitor(js jetstream.JetStream, cfg Config, opts BacklogOptions) (*BacklogMonitor, error) {
	if js == nil {
		return nil, errors.New("backlog monitor: no JetStream context")
	}
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &BacklogMonitor{
		js: js, streams: StreamConfigs(cfg), known: map[string]string{}, interval: opts.Interval,
		log:      opts.Logger.With("component", "backlog"),
		seen:     map[string]map[string]bool{},
		fullWarn: map[string]time.Time{},
		msgs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_stream_messages",
			Help: "Messages in the stream: with interest retention, those not yet acked by every consumer (the backlog)."}, []string{"stream"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_stream_bytes",
			Help: "Bytes in the stream (the backlog); publishes are refused once it reaches tapflow_stream_max_bytes."}, []string{"stream"}),
		maxBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_stream_max_bytes",
			Help: "The stream's max_bytes: the most backlog it holds (nats.stream_max_bytes, nats.meters_stream_max_bytes)."}, []string{"stream"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_consumer_pending_messages",
			Help: "Messages in the stream the consumer has not received yet."}, []string{"stream", "consumer"}),
		ackPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_consumer_ack_pending_messages",
			Help: "Messages delivered to the consumer and not acked yet (the collector acks after the Parquet commit)."}, []string{"stream", "consumer"}),
		pollErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_backlog_poll_errors_total",
			Help: "Stream or consumer info requests that failed (the backlog gauges keep their last values)."}),
	}
	for name, cc := range CollectorConsumerConfigs(cfg.Collector) {
		m.known[name] = cc.Durable
	}
	for _, sc := range m.streams {
		m.msgs.WithLabelValues(sc.Name)
		m.bytes.WithLabelValues(sc.Name)
		m.maxBytes.WithLabelValues(sc.Name).Set(float64(sc.MaxBytes))
		m.seen[sc.Name] = map[string]bool{}
		if d, ok := m.known[sc.Name]; ok {
			m.pending.WithLabelValues(sc.Name, d)
			m.ackPending.WithLabelValues(sc.Name, d)
		}
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{m.msgs, m.bytes, m.maxBytes, m.pending, m.ackPending, m.pollErrors} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("backlog monitor: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Run polls until ctx ends; it returns nil then. A failing poll is
// counted and logged (at most once a minute), never fatal: the backlog
// is observed, not needed.
func (m *BacklogMonitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.Poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll updates the gauges once.
func (m *BacklogMonitor) Poll(ctx context.Context) {
	for _, sc := range m.streams {
		if err := m.pollStream(ctx, sc.Name); err != nil && ctx.Err() == nil {
			m.pollErrors.Inc()
			if time.Since(m.errLog) > time.Minute {
				m.errLog = time.Now()
				m.log.Warn("stream backlog poll failed; gauges keep their last values", "stream", sc.Name, "err", err)
			}
		}
	}
}

func (m *BacklogMonitor) pollStream(ctx context.Context, name string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := m.js.Stream(cctx, name)
	if err != nil {
		return fmt.Errorf("stream info %s: %w", name, err)
	}
	info := st.CachedInfo()
	m.msgs.WithLabelValues(name).Set(float64(info.State.Msgs))
	m.bytes.WithLabelValues(name).Set(float64(info.State.Bytes))
	m.maxBytes.WithLabelValues(name).Set(float64(info.Config.MaxBytes))
	if mx := info.Config.MaxBytes; mx > 0 && float64(info.State.Bytes) >= backlogFullWarn*float64(mx) && time.Since(m.fullWarn[name]) > time.Minute {
		m.fullWarn[name] = time.Now()
		m.log.Warn("stream backlog nearly full: the collectors are down or slower than the agents; once it is full agents spool and retry",
			"stream", name, "bytes", info.State.Bytes, "max_bytes", mx, "messages", info.State.Msgs,
			"fix", "start or scale the collectors; check tapflow_consumer_pending_messages for a consumer that no longer reads")
	}
	now := map[string]bool{}
	lister := st.ListConsumers(cctx)
	for ci := range lister.Info() {
		now[ci.Name] = true
		m.pending.WithLabelValues(name, ci.Name).Set(float64(ci.NumPending))
		m.ackPending.WithLabelValues(name, ci.Name).Set(float64(ci.NumAckPending))
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list consumers of %s: %w", name, err)
	}
	for c := range m.seen[name] {
		if !now[c] && c != m.known[name] {
			m.pending.DeleteLabelValues(name, c)
			m.ackPending.DeleteLabelValues(name, c)
		}
	}
	m.seen[name] = now
	return nil
}
