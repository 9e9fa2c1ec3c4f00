package publish_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// TestForgedMsgIDDoesNotDropABatch: another publisher sends the agent's
// next Nats-Msg-Ids first (the dedupe attack of docs/security.md). The
// agent's first publish is acked as a duplicate — JetStream did not store
// it — so the agent republishes the batch under a new batch_seq: every
// record arrives, the collision is counted and logged. On the old code
// the batch was acked and silently lost.
func TestForgedMsgIDDoesNotDropABatch(t *testing.T) {
	for _, spooled := range []bool{false, true} {
		t.Run("spool="+strconv.FormatBool(spooled), func(t *testing.T) {
			s := transporttest.Run(t, "")
			reg := prometheus.NewRegistry()
			var logs logBuffer
			opts := publish.Options{AgentID: "agent-b", Node: "node-b", StateDir: t.TempDir(), NATS: transport.DefaultConfig(),
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registry: reg}
			if spooled {
				scfg := spool.DefaultConfig()
				scfg.Dir = t.TempDir()
				sp, err := spool.New(scfg, spool.Options{Logger: quiet, Registry: prometheus.NewRegistry()})
				if err != nil {
					t.Fatal(err)
				}
				opts.Spool = sp
			}
			pub, err := publish.New(s.JS, opts)
			if err != nil {
				t.Fatal(err)
			}
			in := make(chan *pipeline.Batch)
			done := make(chan error, 1)
			go func() { done <- pub.Run(context.Background(), in) }()
			send := func(n int) int64 {
				acked := make(chan error, 1)
				b := pipeline.NewBatch(make([]schemas.Flow, n), func(err error) { acked <- err })
				in <- b
				if err := <-acked; err != nil {
					t.Fatal(err)
				}
				return b.Seq
			}
			first := send(3)
			// The attacker burns the next 100 ids, on another subject of the
			// stream (JetStream dedupes per stream, not per subject).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for seq := first + 1; seq <= first+100; seq++ {
				m := nats.NewMsg(transport.FlowsSubject("node-a"))
				m.Data = []byte("forged")
				if _, err := s.JS.PublishMsg(ctx, m, jetstream.WithMsgID("agent-b-"+strconv.FormatInt(seq, 10))); err != nil {
					t.Fatal(err)
				}
			}
			second := send(5)
			close(in)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if second <= first+100 {
				t.Errorf("second batch published as seq %d, inside the burned range %d..%d", second, first+1, first+100)
			}
			if n, ok := gathered(t, reg, "tapflow_publish_id_collisions_total", nil); !ok || n != 1 {
				t.Errorf("tapflow_publish_id_collisions_total = %v, want 1", n)
			}
			if !strings.Contains(logs.String(), "another publisher") {
				t.Errorf("no collision error in the log:\n%s", logs.String())
			}
			st, err := s.JS.Stream(ctx, transport.FlowsStream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(transport.FlowsSubject("node-b")))
			if err != nil {
				t.Fatal(err)
			}
			if n := info.State.Subjects[transport.FlowsSubject("node-b")]; n != 2 {
				t.Fatalf("node-b's subject holds %d messages, want both batches", n)
			}
			m, err := st.GetLastMsgForSubject(ctx, transport.FlowsSubject("node-b"))
			if err != nil {
				t.Fatal(err)
			}
			recs, err := schemas.NewDecoder().Decode(nil, m.Data)
			if err != nil || len(recs) != 5 || recs[0].BatchSeq != second || m.Header.Get(jetstream.MsgIDHeader) != "agent-b-"+strconv.FormatInt(second, 10) {
				t.Fatalf("republished batch: %d records (%v), seq %d, id %q; want 5 records as %d", len(recs), err, recs[0].BatchSeq, m.Header.Get(jetstream.MsgIDHeader), second)
			}
		})
	}
}
