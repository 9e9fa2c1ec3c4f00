package app

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// TestForgedAgentIDLosesNothing: agent A, allowed to publish on its own
// subject, publishes batches under agent B's agent_id and B's next
// batch_seqs long enough ahead that JetStream's dedupe window no longer
// remembers them when B sends the real ones. Then B's real agent runs
// (synthetic → enrich → publish) against the real collector on a real
// nats-server. With the shipped default (collector.agent_id_is_node on)
// A's batches are dead-lettered (identity) and every record B sent is in
// Parquet: 0 lost. The control runs with the check off: the ledger then
// takes A's forgeries for B's batches and skips the real ones — what the
// default prevents, and proof the test can fail.
func TestForgedAgentIDLosesNothing(t *testing.T) {
	for _, c := range []struct {
		name  string
		check bool
	}{{"default agent_id_is_node", true}, {"control: agent_id_is_node off", false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each with its own server, agent and collector
			// The ledger dedupes per hour partition: forgeries and real
			// batches must share an hour for the control to lose.
			if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 20*time.Second {
				time.Sleep(left + time.Second)
			}
			t0 := time.Now()
			dir := t.TempDir()
			cfg := testConfig(t, dir)
			cfg.Node, cfg.Agent.ID = "node-b", "node-b"
			// Deviates from the shipped 2m: the attack is ids burned
			// beyond the dedupe window, which 1s makes a 3s wait.
			cfg.NATS.DuplicateWindow = units.Duration(time.Second)
			cfg.Collector.Consumer.AgentIDIsNode = c.check
			s := transporttest.Listen(t, "", "127.0.0.1:0")
			ctx := context.Background()
			if err := transport.EnsureStreams(ctx, s.JS, cfg.NATS, quiet); err != nil {
				t.Fatal(err)
			}
			// B's batch sequence continues from its state file (kept across
			// restarts): its next ids are known to anyone who saw one.
			first := time.Now().UnixMicro() + int64(time.Hour/time.Microsecond)
			if err := os.MkdirAll(cfg.AgentStateDir(), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(cfg.AgentStateDir(), "batch_seq"), []byte(strconv.FormatInt(first, 10)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			// B sends 5–10 batches a second (batch_records 2000 at 20000/s,
			// batch_max_age 200ms): these cover its first 4 s and more.
			const forged = 40
			enc, err := schemas.NewEncoder(cfg.NATS.Codec)
			if err != nil {
				t.Fatal(err)
			}
			for i := range int64(forged) {
				recs := make([]schemas.Flow, 3)
				for j := range recs {
					recs[j] = schemas.Flow{Node: "node-a", AgentID: "node-b", BatchSeq: first + i, RecordIndex: int32(j),
						TimeEnd: time.Now().UnixMicro(), Bytes: 1 << 30, Packets: 1}
				}
				body, err := enc.Encode(nil, recs)
				if err != nil {
					t.Fatal(err)
				}
				m := &nats.Msg{Subject: transport.FlowsSubject("node-a"), Data: body, Header: nats.Header{}}
				m.Header.Set(jetstream.MsgIDHeader, "node-b-"+strconv.FormatInt(first+i, 10))
				if _, err := s.JS.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			forgedIn := time.Since(t0)
			time.Sleep(3 * cfg.NATS.DuplicateWindow.D()) // the server forgets the ids

			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- runCollector(t, cctx, cfg, s.JS, true) }()
			sent := runAgentFor(t, cfg, s.JS, 2*time.Second)
			agentDone := time.Since(t0)
			cancel() // graceful: drain the stream, commit, ack
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			t.Logf("forgeries published in %s, agent done at %s, collector drained at %s", forgedIn.Round(time.Millisecond), agentDone.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))

			var bRecords, bBytes, forgedRows int64
			for _, r := range readParquet(t, dir) {
				switch r.Node {
				case "node-b":
					bRecords++
					bBytes += r.Bytes
				default:
					forgedRows++
				}
			}
			lost := sent.records.Load() - bRecords
			dlq, err := s.JS.Stream(ctx, transport.DLQStream)
			if err != nil {
				t.Fatal(err)
			}
			dead := dlq.CachedInfo().State.Msgs
			t.Logf("B sent %d records, %d in Parquet (%d lost); forged rows written %d; dead letters %d of %d forged batches",
				sent.records.Load(), bRecords, lost, forgedRows, dead, forged)
			if !c.check {
				if lost == 0 || forgedRows == 0 {
					t.Fatalf("with agent_id_is_node off the forgeries cost B nothing (lost %d, forged rows %d): the attack did not happen, the test proves nothing", lost, forgedRows)
				}
				return
			}
			if lost != 0 || bBytes != sent.bytes.Load() || forgedRows != 0 {
				t.Fatalf("B sent %d records / %d bytes, Parquet holds %d / %d of B and %d forged rows", sent.records.Load(), sent.bytes.Load(), bRecords, bBytes, forgedRows)
			}
			if dead != forged {
				t.Fatalf("%d dead letters, want the %d forged batches", dead, forged)
			}
			for seq := uint64(1); seq <= forged; seq += forged / 3 {
				m, err := dlq.GetMsg(ctx, seq)
				if err != nil {
					t.Fatal(err)
				}
				if r := m.Header.Get(transport.HeaderReason); r != consume.ReasonIdentity {
					t.Fatalf("dead letter %d: reason %q (%s), want identity", seq, r, m.Header.Get(transport.HeaderError))
				}
			}
		})
	}
}
