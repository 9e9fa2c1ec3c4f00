package consume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

// Dead letters per sender. TAPFLOW_DLQ is one stream for every agent; a
// stream-wide bound with discard-old let one agent that publishes garbage
// on its own subject evict every other agent's letters (the only copy of
// their rejected records). So each sender's letters go to a subject of
// their own (transport.DLQSubject) and, after each dead letter, the
// collector deletes that sender's oldest letters beyond
// collector.dlq_letters_per_node: a sender can only ever evict its own.
// The stream refuses rather than evicts when full (DiscardNew). Each
// eviction is counted (tapflow_consume_dlq_evictions_total) and added to
// the sender's tally on transport.DLQEvictedSubject for `tapflow dlq
// inspect`. Only collectors publish dead letters (agents may not publish
// on tapflow.dlq.>), so the collector is where the bound is enforced;
// collectors racing on one sender may briefly leave it a letter over the
// bound, which the next letter's trim removes.

// tallyAttempts bounds the read-add-publish loop of a tally that other
// collectors update at the same moment.
const tallyAttempts = 5

// dlqStream is the TAPFLOW_DLQ handle, looked up once (a stream info
// request) and reused: only its name is used, every count is asked anew.
func (s *SourceOf[T]) dlqStream(ctx context.Context) (jetstream.Stream, error) {
	s.dlqMu.Lock()
	defer s.dlqMu.Unlock()
	if s.dlqSt == nil {
		st, err := s.js.Stream(ctx, transport.DLQStream)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", transport.DLQStream, err)
		}
		s.dlqSt = st
	}
	return s.dlqSt, nil
}

// trimDLQ deletes the oldest letters on subject beyond
// DLQLettersPerNode and tallies them. Failures are logged: a sender left
// over its bound is trimmed at its next letter.
func (s *SourceOf[T]) trimDLQ(subject string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sender := strings.TrimPrefix(subject, s.st.DLQ+".")
	ev, err := s.evictOldest(ctx, subject, sender)
	if ev.Letters > 0 {
		if ok, suppressed := s.evictLog.Allow(10 * time.Second); ok {
			s.log.Warn("dead letters evicted: their sender holds more than collector.dlq_letters_per_node; its own oldest letters were deleted, no other sender's",
				"sender", sender, "evicted", ev.Letters, "bytes", ev.Bytes, "records", ev.Records, "by_reason", ev.ByReason,
				"dlq_letters_per_node", s.cfg.DLQLettersPerNode, "inspect", "tapflow dlq inspect", "evictions_not_logged", suppressed)
		}
		if terr := s.addTally(ctx, transport.DLQEvictedSubject(s.st.DLQ, sender), ev); terr != nil {
			err = errors.Join(err, fmt.Errorf("eviction tally: %w", terr))
		}
	}
	if err != nil {
		s.log.Warn("dead-letter bound not enforced for now; retried at this sender's next letter", "sender", sender, "err", err,
			"fix", "the collector's NATS user needs $JS.API.STREAM.INFO, STREAM.MSG.GET and STREAM.MSG.DELETE of "+transport.DLQStream+" (docs/security.md)")
	}
}

func (s *SourceOf[T]) evictOldest(ctx context.Context, subject, sender string) (transport.DLQEvictions, error) {
	ev := transport.DLQEvictions{Sender: sender, Stream: s.st.Name, ByReason: map[string]uint64{}}
	st, err := s.dlqStream(ctx)
	if err != nil {
		return ev, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return ev, fmt.Errorf("%s info for %s: %w", transport.DLQStream, subject, err)
	}
	excess := int64(info.State.Subjects[subject]) - int64(s.cfg.DLQLettersPerNode)
	for seq := uint64(1); excess > 0; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ev, nil // another collector trimmed it
		}
		if err != nil {
			return ev, fmt.Errorf("read oldest letter of %s: %w", subject, err)
		}
		seq = m.Sequence + 1
		if err := st.DeleteMsg(ctx, m.Sequence); err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) || strings.Contains(err.Error(), "no message found") {
				continue
			}
			return ev, fmt.Errorf("evict letter %d of %s: %w", m.Sequence, subject, err)
		}
		excess--
		s.m.evicted.Inc()
		reason := m.Header.Get(transport.HeaderReason)
		if reason == "" {
			reason = ReasonDecode
		}
		ev.Letters++
		ev.Bytes += uint64(len(m.Data))
		ev.ByReason[reason]++
		// Letters of reason time, identity and empty decoded in this
		// collector before; decode, size and poison ones are not
		// decoded again.
		if reason == ReasonTime || reason == ReasonIdentity || reason == ReasonEmpty {
			if recs, err := s.dec.Decode(nil, m.Data); err == nil {
				ev.Records += uint64(len(recs))
				release(recs)
			}
		}
		now := time.Now().UTC()
		if ev.First.IsZero() {
			ev.First = now
		}
		ev.Last, ev.LastMsgID = now, m.Header.Get(transport.HeaderOrigMsgID)
	}
	return ev, nil
}

// addTally adds ev to the tally on subject: the last message there,
// replaced by a new one published only if the subject's last sequence is
// still the one read (collectors update it concurrently).
func (s *SourceOf[T]) addTally(ctx context.Context, subject string, ev transport.DLQEvictions) error {
	st, err := s.dlqStream(ctx)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		var cur transport.DLQEvictions
		var last uint64
		m, err := st.GetLastMsgForSubject(ctx, subject)
		switch {
		case err == nil:
			last = m.Sequence
			if cur, err = transport.DecodeDLQEvictions(m.Data); err != nil {
				cur = transport.DLQEvictions{} // not ours: start again rather than stop counting
			}
		case errors.Is(err, jetstream.ErrMsgNotFound):
		default:
			return fmt.Errorf("read %s: %w", subject, err)
		}
		cur.Add(ev)
		body, err := json.Marshal(cur)
		if err != nil {
			return err
		}
		_, err = s.js.Publish(ctx, subject, body, jetstream.WithExpectLastSequencePerSubject(last))
		if err == nil {
			if last != 0 {
				_ = st.DeleteMsg(ctx, last) // superseded; left over it costs a few hundred bytes
			}
			return nil
		}
		var apiErr *jetstream.APIError
		if attempt < tallyAttempts && errors.As(err, &apiErr) &&
			(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			continue
		}
		return fmt.Errorf("publish %s: %w", subject, err)
	}
}
