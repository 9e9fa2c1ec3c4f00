package consume

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Early commits: the collector acks a message only once the Parquet file
// holding its records commits, so with interest retention every message
// of an open file stays in the stream. A stream smaller than roll_age ×
// the fleet's rate would fill and refuse publishes; instead the source
// tells the sink to commit early (CommitDue) once what the collectors
// sharing the durable hold unacked reaches collector.early_commit_share
// of the stream's max_bytes or max_msgs, or of the consumer's
// max_ack_pending. Smaller files, never refused publishes.

// Reasons of an early commit (label reason of
// tapflow_consume_early_commits_total).
const (
	// EarlyStreamBytes: held bytes near the share of max_bytes.
	EarlyStreamBytes = "stream_bytes"
	// EarlyStreamMsgs: held messages near the share of max_msgs.
	EarlyStreamMsgs = "stream_msgs"
	// EarlyAckPending: held messages near the share of max_ack_pending
	// (past it JetStream delivers nothing until a file commits).
	EarlyAckPending = "ack_pending"
)

// EarlyReasons lists every early-commit reason.
var EarlyReasons = []string{EarlyStreamBytes, EarlyStreamMsgs, EarlyAckPending}

// DefaultEarlyCommitShare is collector.early_commit_share's default: the
// collectors hold at most half the stream unacked; the other half is
// room for publishes while files commit and for a backlog while a
// collector restarts.
const DefaultEarlyCommitShare = 0.5

// defaultPressureInterval is how often the stream's limits and the
// durable's ack-pending count are polled.
const defaultPressureInterval = time.Second

// jsStoreOverhead approximates JetStream's per-message storage beyond
// subject, headers and body (file store record header and checksum).
const jsStoreOverhead = 30

// pressure is the latest poll of the stream and the durable consumer.
type pressure struct {
	mu            sync.Mutex
	gen           uint64 // polls so far
	maxBytes      int64  // stream max_bytes (≤ 0: none)
	maxMsgs       int64  // stream max_msgs (≤ 0: none)
	maxAckPending int64  // consumer max_ack_pending (≤ 0: none)
	ackPending    int64  // the durable's num_ack_pending: every collector's held messages
	heldAtPoll    int64  // this source's held messages when ackPending was read
	avgBytes      int64  // stream bytes / msgs: the size of another collector's held message
	firedGen      uint64 // poll generation of the last early commit from the shared estimate
}

// messageSize is what msg takes in the stream.
func messageSize(msg jetstream.Msg) int64 {
	n := int64(len(msg.Subject()) + len(msg.Data()) + jsStoreOverhead)
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}

// pollPressure reads the stream's limits and the durable's ack-pending
// count every interval until done is closed. A failed poll keeps the last
// values: early commits then go by this source's own holdings.
func (s *SourceOf[T]) pollPressure(done <-chan struct{}, cons jetstream.Consumer) {
	t := time.NewTicker(s.pressEvery)
	defer t.Stop()
	for {
		s.pollOnce(cons)
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

func (s *SourceOf[T]) pollOnce(cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, s.st.Name)
	if err != nil {
		return
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return
	}
	s.heldMu.Lock()
	held := int64(len(s.held))
	s.heldMu.Unlock()
	si := st.CachedInfo()
	p := &s.press
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.maxBytes, p.maxMsgs = si.Config.MaxBytes, si.Config.MaxMsgs
	p.maxAckPending = int64(ci.Config.MaxAckPending)
	p.ackPending, p.heldAtPoll = int64(ci.NumAckPending), held
	if si.State.Msgs > 0 {
		p.avgBytes = int64(si.State.Bytes / si.State.Msgs)
	}
}

// CommitDue is the sink's early-commit trigger (parquet.Options.CommitDue):
// it returns the reason (one of EarlyReasons) when the open files should
// be committed now, "" otherwise. The sink calls it after each batch it
// holds. It counts and logs (rate-limited) every early commit it asks for.
//
// The durable's held total is estimated as this source's held messages
// and bytes now plus what the other collectors held at the last poll
// (num_ack_pending minus this source's held then, at the stream's mean
// message size), so every collector sharing the durable sees the shared
// stream fill and no collector count needs configuring. Another
// collector's commit is seen only at the next poll, so the estimate
// asks for at most one early commit per poll unless this source's own
// holdings alone reach the limit.
func (s *SourceOf[T]) CommitDue() string {
	s.heldMu.Lock()
	msgs, bytes := int64(len(s.held)), s.heldBytes
	s.heldMu.Unlock()
	if msgs == 0 {
		return ""
	}
	share := s.cfg.EarlyCommitShare
	p := &s.press
	p.mu.Lock()
	defer p.mu.Unlock()
	reach := func(have, limit int64) bool { return limit > 0 && float64(have) >= share*float64(limit) }
	reason := func(m, b int64) string {
		switch {
		case reach(b, p.maxBytes):
			return EarlyStreamBytes
		case reach(m, p.maxMsgs):
			return EarlyStreamMsgs
		case reach(m, p.maxAckPending):
			return EarlyAckPending
		}
		return ""
	}
	r := reason(msgs, bytes) // this collector alone
	totMsgs, totBytes := msgs, bytes
	if r == "" && p.gen > p.firedGen {
		others := max(p.ackPending-p.heldAtPoll, 0)
		totMsgs, totBytes = msgs+others, bytes+others*p.avgBytes
		r = reason(totMsgs, totBytes)
	}
	if r == "" {
		return ""
	}
	p.firedGen = p.gen
	s.m.early.WithLabelValues(r).Inc()
	if ok, suppressed := s.earlyLog.Allow(time.Minute); ok {
		limitOf := map[string]int64{EarlyStreamBytes: p.maxBytes, EarlyStreamMsgs: p.maxMsgs, EarlyAckPending: p.maxAckPending}
		s.log.Warn("committing the open Parquet files early: the messages held unacked until their files commit near this share of the stream; the stream is smaller than roll_age × the rate, so files are smaller than roll_size",
			"reason", r, "held_messages", msgs, "held_bytes", bytes, "durable_held_messages", totMsgs, "durable_held_bytes", totBytes,
			"limit", limitOf[r], "early_commit_share", share, "early_commits_not_logged", suppressed,
			"fix", "raise nats.stream_max_bytes (and collector.max_ack_pending) to hold roll_age × the fleet's rate (tapflow validate prints the rate the settings carry), or lower collector.roll_age")
	}
	return r
}
