package publish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// errStreamFull marks a publish JetStream refused because the stream
// holds max_bytes (discard new): NATS answers, the backlog is full.
var errStreamFull = errors.New("stream backlog full")

// jsStoreFailed is JSStreamStoreFailedF, the code of a publish ack whose
// message the stream could not store; its description says why
// (nats-server ErrMaxBytes = "maximum bytes exceeded").
const jsStoreFailed = 10077

// isStreamFull reports whether err is JetStream refusing a publish because
// the stream reached its byte or message limit.
func isStreamFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jsStoreFailed {
		return false
	}
	return strings.Contains(apiErr.Description, "maximum bytes exceeded") ||
		strings.Contains(apiErr.Description, "maximum messages exceeded")
}

// fullLogEvery bounds the stream-full log line and the StreamInfo request
// behind it to one per interval per publisher.
const fullLogEvery = 30 * time.Second

// refusedVec is tapflow_publish_refused_total, shared by every publisher
// of a process (the stream label tells them apart).
func refusedVec(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tapflow_publish_refused_total",
		Help: "Publishes JetStream refused although it answered, by stream and reason (stream_full: the stream holds max_bytes; the batch is spooled or retried).",
	}, []string{"stream", "reason"})
	if reg == nil {
		return v, nil
	}
	if err := reg.Register(v); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, err
	}
	return v, nil
}

// logStreamFull says that the stream's backlog is full, how big it is and
// what to do, at most once per fullLogEvery (the stream size comes from one
// StreamInfo request per line). action says what happens to the batch.
func (p *PublisherOf[T]) logStreamFull(id, action string, err error) {
	ok, suppressed := p.fullLog.Allow(fullLogEvery)
	if !ok {
		return
	}
	attrs := []any{"stream", p.kind.Stream, "msg_id", id, "batch", action}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	st, serr := p.js.Stream(ctx, p.kind.Stream)
	cancel()
	if serr == nil {
		info := st.CachedInfo()
		attrs = append(attrs, "max_bytes", info.Config.MaxBytes, "bytes", info.State.Bytes, "messages", info.State.Msgs,
			"consumers", info.State.Consumers)
	} else {
		attrs = append(attrs, "max_bytes", "unknown", "stream_info_err", serr)
	}
	attrs = append(attrs, "err", err, "lines_suppressed", suppressed,
		"fix", fmt.Sprintf("the collectors are down or slower than the agents: check that they run and tapflow_consume_stream_pending_messages{stream=%q}; or raise %s", p.kind.Stream, p.kind.MaxBytesKey))
	p.log.Error("stream backlog full: JetStream refuses new batches until the collectors consume", attrs...)
}

// failureCause names why batches are not reaching JetStream, for the loss
// line when the spool overflows.
func (p *PublisherOf[T]) failureCause() string {
	if p.full.Load() {
		return "stream " + p.kind.Stream + " backlog full"
	}
	return "NATS unreachable"
}
