// Package dlq reads and replays TAPFLOW_DLQ, where the collector moves the
// messages it rejects (transport/consume: decode, size, identity, time).
// [List] shows dead letters; [Replay] republishes them to their original
// subject with their original Nats-Msg-Id and deletes each from the DLQ
// only after JetStream acked the publish. `tapflow dlq` is its CLI.
package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// Letter is one dead letter.
type Letter struct {
	Seq         uint64    `json:"seq"` // in TAPFLOW_DLQ
	Time        time.Time `json:"time"`
	Subject     string    `json:"subject"` // tapflow.dlq.<flows|meters>.<sender> (tapflow.dlq.flows, .meters: older collectors)
	Sender      string    `json:"sender"`  // transport.DLQSender of the original subject
	OrigSubject string    `json:"original_subject"`
	OrigStream  string    `json:"original_stream"`
	OrigSeq     uint64    `json:"original_sequence"`
	MsgID       string    `json:"msg_id"`
	Reason      string    `json:"reason"`
	Error       string    `json:"error"`
	Bytes       int       `json:"bytes"`
	Records     int       `json:"records"` // -1: does not decode
	DecodeError string    `json:"decode_error,omitempty"`
	header      nats.Header
	data        []byte
}

// Filter selects dead letters; empty fields match everything.
type Filter struct {
	Reason  string          // exact Tapflow-Reason
	Subject string          // original subject, NATS wildcards (* and >) allowed
	Seqs    map[uint64]bool // DLQ sequences
}

func (f Filter) match(l *Letter) bool {
	return (f.Reason == "" || l.Reason == f.Reason) &&
		(f.Subject == "" || SubjectMatch(f.Subject, l.OrigSubject)) &&
		(len(f.Seqs) == 0 || f.Seqs[l.Seq])
}

// SubjectMatch reports whether subject matches the NATS pattern (tokens
// separated by '.', '*' one token, '>' the rest).
func SubjectMatch(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range p {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// decode limits for counting records: the collector's hard ceiling.
const (
	maxBytes   = 512 << 20
	maxRecords = 1 << 24
)

var (
	flowDec, _  = schemas.NewDecoder().Limited(maxBytes, maxRecords)
	meterDec, _ = schemas.NewDecoderFor(schemas.MeterTable).Limited(maxBytes, maxRecords)
)

func letterOf(m *jetstream.RawStreamMsg) Letter {
	h := m.Header
	l := Letter{Seq: m.Sequence, Time: m.Time, Subject: m.Subject, OrigSubject: h.Get(transport.HeaderOrigSubject),
		OrigStream: h.Get(transport.HeaderOrigStream), MsgID: h.Get(transport.HeaderOrigMsgID), Reason: h.Get(transport.HeaderReason),
		Error: h.Get(transport.HeaderError), Bytes: len(m.Data), Records: -1, header: h, data: m.Data}
	l.OrigSeq, _ = strconv.ParseUint(h.Get(transport.HeaderOrigSeq), 10, 64)
	l.Sender = transport.DLQSender(l.OrigSubject)
	if l.Reason == "" {
		l.Reason = "decode" // dead letters of collectors before Tapflow-Reason: decode failures only
	}
	n, err := countRecords(m.Subject, l.OrigSubject, m.Data)
	if err != nil {
		l.DecodeError = err.Error()
	} else {
		l.Records = n
	}
	return l
}

// countRecords decodes a dead letter's body to count its records. A dead
// letter is by definition a message a collector could not take, possibly
// one whose decode panicked there: the panic is an error here, so inspect
// and replay list it instead of dying on it.
func countRecords(subject, origSubject string, data []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			n, err = 0, fmt.Errorf("decoder panicked: %v", r)
		}
	}()
	if strings.HasPrefix(origSubject, transport.MetersSubjectRoot+".") || subject == transport.DLQMetersSubject || strings.HasPrefix(subject, transport.DLQMetersSubject+".") {
		recs, err := meterDec.Decode(nil, data)
		return len(recs), err
	}
	recs, err := flowDec.Decode(nil, data)
	return len(recs), err
}

// List calls fn for every dead letter that f selects, oldest first. It
// reads the stream with direct gets: it creates no consumer and changes
// nothing. The eviction tallies (Evictions) are not letters.
func List(ctx context.Context, js jetstream.JetStream, f Filter, fn func(Letter) error) error {
	st, err := js.Stream(ctx, transport.DLQStream)
	if err != nil {
		return fmt.Errorf("open %s: %w", transport.DLQStream, err)
	}
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(transport.DLQSubjectRoot+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s at seq %d: %w", transport.DLQStream, seq, err)
		}
		seq = m.Sequence + 1
		if strings.HasPrefix(m.Subject, transport.DLQEvictedRoot+".") {
			continue
		}
		l := letterOf(m)
		if !f.match(&l) {
			continue
		}
		if err := fn(l); err != nil {
			return err
		}
	}
}

// Evictions returns every sender's tally of dead letters the collectors
// evicted to keep it within collector.dlq_letters_per_node, sorted by
// letters evicted, most first.
func Evictions(ctx context.Context, js jetstream.JetStream) ([]transport.DLQEvictions, error) {
	st, err := js.Stream(ctx, transport.DLQStream)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", transport.DLQStream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(transport.DLQEvictedRoot+".>"))
	if err != nil {
		return nil, fmt.Errorf("%s info: %w", transport.DLQStream, err)
	}
	subjects := slices.Sorted(maps.Keys(info.State.Subjects))
	out := make([]transport.DLQEvictions, 0, len(subjects))
	for _, subj := range subjects {
		m, err := st.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // replaced between the two reads
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", subj, err)
		}
		e, err := transport.DecodeDLQEvictions(m.Data)
		if err != nil {
			return nil, fmt.Errorf("%s at seq %d: %w", subj, m.Sequence, err)
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b transport.DLQEvictions) int { return cmp.Compare(b.Letters, a.Letters) })
	return out, nil
}

// dlqHeaders are the headers the collector adds to a dead letter.
var dlqHeaders = map[string]bool{
	transport.HeaderOrigSubject: true, transport.HeaderOrigSeq: true, transport.HeaderOrigStream: true,
	transport.HeaderOrigMsgID: true, transport.HeaderReason: true, transport.HeaderError: true,
}

// Outcome of replaying one dead letter.
type Outcome string

// Outcomes.
const (
	// Replayed: published and acked, then deleted from the DLQ.
	Replayed Outcome = "replayed"
	// AlreadyDelivered: JetStream already holds a later copy with this
	// message id (an earlier replay landed); deleted from the DLQ.
	AlreadyDelivered Outcome = "already-delivered"
	// Held: the stream still remembers the rejected original's message id
	// (its duplicate window has not passed), so the publish was
	// deduplicated away; the letter stays, retry after the window.
	Held Outcome = "held"
	// Skipped: cannot be replayed (no original subject or message id).
	Skipped Outcome = "skipped"
	// WouldReplay: --dry-run.
	WouldReplay Outcome = "would-replay"
	// Failed: publish or delete failed; see Result.Err.
	Failed Outcome = "failed"
)

// Result is what happened to one letter.
type Result struct {
	Letter  Letter  `json:"letter"`
	Outcome Outcome `json:"outcome"`
	Detail  string  `json:"detail,omitempty"`
	NewSeq  uint64  `json:"new_seq,omitempty"` // in the original stream
}

// streamOf names the stream an original subject belongs to.
func streamOf(subject string) string {
	switch {
	case strings.HasPrefix(subject, transport.FlowsSubjectRoot+"."):
		return transport.FlowsStream
	case strings.HasPrefix(subject, transport.MetersSubjectRoot+"."):
		return transport.MetersStream
	}
	return ""
}

// Replay republishes every dead letter f selects to its original subject,
// with its original headers and Nats-Msg-Id, expecting its original
// stream; a letter is deleted from the DLQ only after the publish ack.
// dryRun publishes and deletes nothing. timeout bounds each publish. fn
// gets each result; Replay stops at the first error reading the DLQ.
func Replay(ctx context.Context, js jetstream.JetStream, f Filter, dryRun bool, timeout time.Duration, fn func(Result)) error {
	st, err := js.Stream(ctx, transport.DLQStream)
	if err != nil {
		return fmt.Errorf("open %s: %w", transport.DLQStream, err)
	}
	// Collect first: replaying while iterating would race the collector
	// dead-lettering the replay again (a cause not fixed) into new
	// sequences this loop would then replay forever.
	var letters []Letter
	if err := List(ctx, js, f, func(l Letter) error { letters = append(letters, l); return nil }); err != nil {
		return err
	}
	for _, l := range letters {
		fn(replayOne(ctx, js, st, l, dryRun, timeout))
	}
	return nil
}

func replayOne(ctx context.Context, js jetstream.JetStream, st jetstream.Stream, l Letter, dryRun bool, timeout time.Duration) Result {
	r := Result{Letter: l}
	stream := streamOf(l.OrigSubject)
	switch {
	case stream == "":
		r.Outcome, r.Detail = Skipped, fmt.Sprintf("original subject %q is not a tapflow flow or meter subject", l.OrigSubject)
		return r
	case l.Reason == consume.ReasonEmpty:
		r.Outcome, r.Detail = Skipped, "no records to replay; republishing it would only burn its message id again"
		return r
	case l.MsgID == "":
		r.Outcome, r.Detail = Skipped, "no original Nats-Msg-Id: the collector would reject it again (reason identity); only the agent can resend it"
		return r
	case dryRun:
		r.Outcome, r.Detail = WouldReplay, "to "+l.OrigSubject+" as "+l.MsgID
		return r
	}
	m := &nats.Msg{Subject: l.OrigSubject, Data: l.data, Header: nats.Header{}}
	for k, v := range l.header {
		// The batch's own headers (Tapflow-Schema, -Codec, …: the
		// subscriber contract) go back; JetStream's and the DLQ's do not.
		if !strings.HasPrefix(k, "Nats-") && !dlqHeaders[k] {
			m.Header[k] = v
		}
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	ack, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(l.MsgID), jetstream.WithExpectStream(stream))
	cancel()
	if err != nil {
		r.Outcome, r.Detail = Failed, fmt.Sprintf("publish to %s: %v (kept in the DLQ)", l.OrigSubject, err)
		return r
	}
	r.NewSeq = ack.Sequence
	r.Outcome, r.Detail = Replayed, fmt.Sprintf("%s seq %d", stream, ack.Sequence)
	if ack.Duplicate {
		if ack.Sequence == l.OrigSeq {
			r.Outcome = Held
			r.Detail = fmt.Sprintf("%s still remembers message id %s of the rejected original (seq %d) within its duplicate window (nats.duplicate_window), so nothing was re-injected; kept in the DLQ: replay again once the window has passed since %s",
				stream, l.MsgID, l.OrigSeq, l.Time.UTC().Format(time.RFC3339))
			return r
		}
		r.Outcome, r.Detail = AlreadyDelivered, fmt.Sprintf("%s already holds %s at seq %d (an earlier replay)", stream, l.MsgID, ack.Sequence)
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := st.DeleteMsg(dctx, l.Seq); err != nil {
		r.Outcome, r.Detail = Failed, fmt.Sprintf("%s, but deleting it from %s failed: %v (a second replay is deduplicated within the duplicate window, and by the collector's dedupe after it)", r.Detail, transport.DLQStream, err)
	}
	return r
}
