package consume

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"
)

// TestCommitDue: the early-commit trigger from this source's holdings and
// the durable's polled total, with at most one early commit per poll from
// the shared estimate; every reason asked for is counted.
func TestCommitDue(t *testing.T) {
	type poll struct {
		maxBytes, maxMsgs, maxAckPending int64
		ackPending, heldAtPoll, avgBytes int64
	}
	for _, tc := range []struct {
		name      string
		poll      poll
		msgs      int
		bytes     int64
		want      []string // successive calls, same poll
		afterPoll string   // the next call after a new poll
	}{
		{name: "nothing held", poll: poll{maxBytes: 1000}, want: []string{""}},
		{name: "no poll yet: limits unknown", msgs: 1000, bytes: 1 << 30, want: []string{""}},
		{name: "own bytes reach the share: every time", poll: poll{maxBytes: 1000, ackPending: 10, heldAtPoll: 10}, msgs: 10, bytes: 500,
			want: []string{EarlyStreamBytes, EarlyStreamBytes}},
		{name: "own bytes below the share", poll: poll{maxBytes: 1000, ackPending: 10, heldAtPoll: 10}, msgs: 10, bytes: 499, want: []string{""}},
		{name: "other collectors' holdings push it over: once per poll", poll: poll{maxBytes: 1000, ackPending: 12, heldAtPoll: 2, avgBytes: 50},
			msgs: 2, bytes: 100, want: []string{EarlyStreamBytes, ""}, afterPoll: EarlyStreamBytes},
		{name: "own commit since the poll is not counted twice", poll: poll{maxAckPending: 200, ackPending: 100, heldAtPoll: 90},
			msgs: 1, bytes: 10, want: []string{""}},
		{name: "max_msgs", poll: poll{maxMsgs: 100, ackPending: 50, heldAtPoll: 50}, msgs: 50, bytes: 50, want: []string{EarlyStreamMsgs}},
		{name: "max_ack_pending", poll: poll{maxBytes: 1 << 40, maxAckPending: 200, ackPending: 100, heldAtPoll: 100}, msgs: 100, bytes: 100,
			want: []string{EarlyAckPending}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.AckWait = units.Duration(7 * time.Minute)
			s, err := NewFor(nil, FlowStream, cfg, Options{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.msgs {
				h := &ackHandle{size: tc.bytes / int64(tc.msgs)}
				s.held[uint64(i+1)] = h
			}
			s.heldBytes = tc.bytes
			p := &s.press
			p.maxBytes, p.maxMsgs, p.maxAckPending = tc.poll.maxBytes, tc.poll.maxMsgs, tc.poll.maxAckPending
			p.ackPending, p.heldAtPoll, p.avgBytes = tc.poll.ackPending, tc.poll.heldAtPoll, tc.poll.avgBytes
			if tc.poll != (poll{}) {
				p.gen = 1
			}
			counted := 0
			for i, want := range tc.want {
				if got := s.CommitDue(); got != want {
					t.Fatalf("call %d: %q, want %q", i+1, got, want)
				}
				if want != "" {
					counted++
				}
			}
			if tc.afterPoll != "" {
				p.gen++
				if got := s.CommitDue(); got != tc.afterPoll {
					t.Fatalf("after the next poll: %q, want %q", got, tc.afterPoll)
				}
				counted++
			}
			total := 0.0
			for _, r := range EarlyReasons {
				total += testutil.ToFloat64(s.m.early.WithLabelValues(r))
			}
			if int(total) != counted {
				t.Errorf("tapflow_consume_early_commits_total = %v, want %d", total, counted)
			}
		})
	}
}
