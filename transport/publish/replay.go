package publish

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// waitDrained returns once the spool is empty, replay has failed
// continuously for a grace period (2 × publish_timeout + 2s: NATS is
// down, the entries wait on disk for the next start), or ctx ends.
func (p *PublisherOf[T]) waitDrained(ctx context.Context) {
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
func (p *PublisherOf[T]) syncLoop(ctx context.Context) {
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

func (p *PublisherOf[T]) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// connPoll is how often the replayer looks whether a lost connection is
// back (a status check, no I/O).
const connPoll = 100 * time.Millisecond

// replay publishes spooled entries oldest first until ctx ends, retrying
// each with backoff; only an acknowledged entry is consumed.
func (p *PublisherOf[T]) replay(ctx context.Context) {
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
		if nc := p.js.Conn(); nc != nil && !nc.IsConnected() {
			// Not an answer from NATS, so no attempt and no backoff:
			// before its first connect a connection has no server INFO
			// and nats.go refuses every publish with headers
			// (ErrHeadersNotSupported, a misleading "headers not
			// supported by this server"); while reconnecting it fails
			// it at once. The entry stays first in the spool, and the
			// replay starts within connPoll of the connection coming up
			// instead of after up to 5 s of backoff grown during the
			// outage.
			p.setFailing(true)
			if time.Since(lastLog) > 30*time.Second {
				lastLog = time.Now()
				n, bytes := p.sp.Pending()
				p.log.Warn("spool replay: NATS not connected; the spool waits", "status", nc.Status().String(), "spooled_batches", n, "spooled_bytes", bytes)
			}
			sleep(ctx, connPoll)
			delay = 100 * time.Millisecond
			continue
		}
		msg := &nats.Msg{Subject: e.Subject, Data: e.Body, Header: p.spooledHeader(e)}
		err = p.publishOnce(ctx, msg, e.MsgID, e.Records, false)
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
		if errors.Is(err, errStreamFull) {
			p.logStreamFull(e.MsgID, "stays in the spool until the stream has room", err)
		} else if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			n, bytes := p.sp.Pending()
			p.log.Warn("spool replay: publish failed; retrying", "msg_id", e.MsgID, "spooled_batches", n, "spooled_bytes", bytes, "retry_in", delay, "err", err)
		}
		sleep(ctx, delay)
		// A full stream is NATS answering: room comes back as soon as a
		// collector acks, and a refused attempt costs one round trip,
		// so the replay looks again every second at most rather than
		// sleeping up to 5 s past the moment the backlog has room.
		delay = min(delay*2, 5*time.Second)
		if errors.Is(err, errStreamFull) {
			delay = min(delay, fullRetryMax)
		}
	}
}

// fullRetryMax caps the replay's backoff while the stream is full.
const fullRetryMax = time.Second

func (p *PublisherOf[T]) setFailing(v bool) (changed bool) {
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

// spooledHeader rebuilds the batch headers of a spooled entry (the spool
// keeps bodies, not headers); the codec comes from the body itself, since
// nats.codec may have changed since it was spooled.
func (p *PublisherOf[T]) spooledHeader(e *spool.Entry) nats.Header {
	codec, err := schemas.BodyCodec(e.Body)
	if err != nil {
		codec = p.enc.Codec() // a corrupt body: the collector dead-letters it
	}
	agent := strings.TrimSuffix(e.MsgID, "-"+strconv.FormatInt(e.Seq, 10)) // as stamped on its records
	return transport.BatchHeader(p.enc.Schema(), codec, agent, e.Seq, e.Records)
}
