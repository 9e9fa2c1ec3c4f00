package consume_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

var checkNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// batch returns n records as the agent on node "cmp1" stamps batch 7.
func batch(n int) []schemas.Flow {
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: "cmp1", AgentID: "agent-a", BatchSeq: 7, RecordIndex: int32(i), TimeEnd: checkNow.Add(-time.Minute).UnixMicro()}
	}
	return recs
}

func flowIdentity(r *schemas.Flow) consume.Identity { return consume.FlowStream.Identity(r) }

func TestCheck(t *testing.T) {
	lim := consume.Limits{MaxRecords: 100, MaxRecordAge: 7 * 24 * time.Hour, MaxClockSkew: time.Hour}
	const subject, id = "tapflow.flows.v1.cmp1", "agent-a-7"
	cases := []struct {
		name    string
		recs    []schemas.Flow
		subject string
		msgID   string
		reason  string // "" = accepted
		errHas  string
	}{
		{"good", batch(10), subject, id, "", ""},
		{"empty message", nil, subject, "", consume.ReasonEmpty, "no records and no Nats-Msg-Id"},
		{"empty message under an id", nil, subject, "cmp2-7", consume.ReasonEmpty, `"cmp2-7"`},
		{"exactly max records", batch(100), subject, id, "", ""},
		{"record indexes in any order", func() []schemas.Flow { r := batch(3); r[0].RecordIndex, r[2].RecordIndex = 2, 0; return r }(), subject, id, "", ""},
		{"time_end at the skew edge", func() []schemas.Flow { r := batch(2); r[1].TimeEnd = checkNow.Add(time.Hour).UnixMicro(); return r }(), subject, id, "", ""},
		{"time_end at the age edge", func() []schemas.Flow {
			r := batch(2)
			r[1].TimeEnd = checkNow.Add(-7 * 24 * time.Hour).UnixMicro()
			return r
		}(), subject, id, "", ""},

		{"too many records", batch(101), subject, id, consume.ReasonSize, "max_batch_records 100"},
		{"node differs from subject", func() []schemas.Flow { r := batch(5); r[3].Node = "cmp2"; return r }(), subject, id, consume.ReasonIdentity, `record 3 has node "cmp2"`},
		{"all records of another node", batch(5), "tapflow.flows.v1.cmp9", id, consume.ReasonIdentity, `says "cmp9"`},
		{"no Nats-Msg-Id", batch(5), subject, "", consume.ReasonIdentity, "Nats-Msg-Id"},
		{"Nats-Msg-Id of another batch", batch(5), subject, "agent-a-8", consume.ReasonIdentity, `"agent-a-7"`},
		{"Nats-Msg-Id of another agent", batch(5), subject, "agent-b-7", consume.ReasonIdentity, "Nats-Msg-Id"},
		{"no agent_id", func() []schemas.Flow {
			r := batch(2)
			for i := range r {
				r[i].AgentID = ""
			}
			return r
		}(), subject, "-7", consume.ReasonIdentity, "no agent_id"},
		{"two batches in one message", func() []schemas.Flow { r := batch(4); r[2].BatchSeq = 8; return r }(), subject, id, consume.ReasonIdentity, "one agent batch"},
		{"two agents in one message", func() []schemas.Flow { r := batch(4); r[1].AgentID = "agent-b"; return r }(), subject, id, consume.ReasonIdentity, "one agent batch"},
		{"duplicate record_index", func() []schemas.Flow { r := batch(4); r[3].RecordIndex = 1; return r }(), subject, id, consume.ReasonIdentity, "record 3 has record_index 1"},
		{"record_index beyond n", func() []schemas.Flow { r := batch(4); r[0].RecordIndex = 4; return r }(), subject, id, consume.ReasonIdentity, "0..3"},
		{"negative record_index", func() []schemas.Flow { r := batch(4); r[0].RecordIndex = -1; return r }(), subject, id, consume.ReasonIdentity, "record_index -1"},
		{"clock ahead", func() []schemas.Flow { r := batch(3); r[2].TimeEnd = checkNow.Add(2 * time.Hour).UnixMicro(); return r }(), subject, id, consume.ReasonTime, "2h0m0s ahead"},
		{"too old", func() []schemas.Flow {
			r := batch(3)
			r[1].TimeEnd = checkNow.Add(-8 * 24 * time.Hour).UnixMicro()
			return r
		}(), subject, id, consume.ReasonTime, "max_record_age"},
		{"year -144169", func() []schemas.Flow { r := batch(3); r[0].TimeEnd = -4611686018427387904; return r }(), subject, id, consume.ReasonTime, "record 0 time_end"},
		{"time_end zero", func() []schemas.Flow { r := batch(3); r[1].TimeEnd = 0; return r }(), subject, id, consume.ReasonTime, "record 1"},
		{"identity wins over time", func() []schemas.Flow {
			r := batch(3)
			r[0].TimeEnd = 0
			r[2].Node = "x"
			return r
		}(), subject, id, consume.ReasonIdentity, "node"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rej := consume.Check(tc.recs, flowIdentity, tc.subject, tc.msgID, checkNow, lim)
			if tc.reason == "" {
				if rej != nil {
					t.Fatalf("rejected: %v", rej)
				}
				return
			}
			if rej == nil {
				t.Fatalf("accepted, want reason %s", tc.reason)
			}
			if rej.Reason != tc.reason || !strings.Contains(rej.Err.Error(), tc.errHas) {
				t.Fatalf("got %v; want reason %s with %q", rej, tc.reason, tc.errHas)
			}
		})
	}
}

// TestCheckMeters: the meter stream reads the same identity fields.
func TestCheckMeters(t *testing.T) {
	lim := consume.Limits{MaxRecords: 10, MaxRecordAge: time.Hour, MaxClockSkew: time.Minute}
	recs := []schemas.Meter{
		{Node: "cmp1", AgentID: "a", BatchSeq: 3, RecordIndex: 0, TimeEnd: checkNow.UnixMicro()},
		{Node: "cmp1", AgentID: "a", BatchSeq: 3, RecordIndex: 1, TimeEnd: checkNow.UnixMicro()},
	}
	if rej := consume.Check(recs, consume.MeterStream.Identity, "tapflow.meters.v1.cmp1", "a-3", checkNow, lim); rej != nil {
		t.Fatalf("good meter batch rejected: %v", rej)
	}
	recs[1].TimeEnd = checkNow.Add(2 * time.Minute).UnixMicro()
	if rej := consume.Check(recs, consume.MeterStream.Identity, "tapflow.meters.v1.cmp1", "a-3", checkNow, lim); rej == nil || rej.Reason != consume.ReasonTime {
		t.Fatalf("skewed meter batch: %v, want reason time", rej)
	}
	recs[1].Node = "cmp2"
	if rej := consume.Check(recs, consume.MeterStream.Identity, "tapflow.meters.v1.cmp1", "a-3", checkNow, lim); rej == nil || rej.Reason != consume.ReasonIdentity {
		t.Fatalf("wrong-node meter batch: %v, want reason identity", rej)
	}
}

// BenchmarkCheck: the per-message checks on a 16384-record batch (the
// default batch size), to show they are cheap next to decoding.
func BenchmarkCheck(b *testing.B) {
	recs := batch(16384)
	lim := consume.Limits{MaxRecords: 1 << 20, MaxRecordAge: 7 * 24 * time.Hour, MaxClockSkew: time.Hour}
	for b.Loop() {
		if rej := consume.Check(recs, flowIdentity, "tapflow.flows.v1.cmp1", "agent-a-7", checkNow, lim); rej != nil {
			b.Fatal(rej)
		}
	}
}

// TestCheckAgentIDIsNode: every combination of the subject's node, the
// records' node column and their agent_id. A record whose node is not the
// subject's is an identity failure always; with collector.agent_id_is_node
// (the default) so is an agent_id that is not the subject's node — an
// agent claiming another agent's batch on its own subject, which would
// make the sink's ledger skip the real batch.
func TestCheckAgentIDIsNode(t *testing.T) {
	if !consume.DefaultConfig().AgentIDIsNode {
		t.Fatal("collector.agent_id_is_node is off by default")
	}
	const subject = "tapflow.flows.v1.cmp1"
	recs := func(node, agent string) []schemas.Flow {
		r := batch(3)
		for i := range r {
			r[i].Node, r[i].AgentID = node, agent
		}
		return r
	}
	for _, c := range []struct {
		name, node, agent string
		// errOn / errOff: what the rejection names with the check on
		// (default) and off; "" = accepted.
		errOn, errOff string
	}{
		{"agent_id = node = subject node", "cmp1", "cmp1", "", ""},
		{"agent_id another node's, node the subject's", "cmp1", "cmp2", "agent_id_is_node", ""},
		{"custom agent_id, node the subject's", "cmp1", "agent-a", "agent_id_is_node", ""},
		{"node another's, agent_id the subject's", "cmp2", "cmp1", `has node "cmp2"`, `has node "cmp2"`},
		{"node and agent_id another node's (agent_id = node)", "cmp2", "cmp2", `has node "cmp2"`, `has node "cmp2"`},
		{"node another's, custom agent_id", "cmp2", "agent-a", `has node "cmp2"`, `has node "cmp2"`},
		{"agent_id, node and subject all differ", "cmp2", "cmp3", `has node "cmp2"`, `has node "cmp2"`},
	} {
		for _, on := range []bool{true, false} {
			want := c.errOff
			if on {
				want = c.errOn
			}
			t.Run(fmt.Sprintf("%s/agent_id_is_node=%v", c.name, on), func(t *testing.T) {
				lim := consume.Limits{MaxRecords: 100, MaxRecordAge: 7 * 24 * time.Hour, MaxClockSkew: time.Hour, AgentIDIsNode: on}
				rej := consume.Check(recs(c.node, c.agent), flowIdentity, subject, c.agent+"-7", checkNow, lim)
				switch {
				case want == "" && rej != nil:
					t.Fatalf("rejected: %v", rej)
				case want != "" && (rej == nil || rej.Reason != consume.ReasonIdentity || !strings.Contains(rej.Error(), want)):
					t.Fatalf("got %v, want reason identity naming %q", rej, want)
				}
			})
		}
	}
}

// TestCheckHeaders: the batch headers subscribers dedupe on must describe
// the message's own records when present.
func TestCheckHeaders(t *testing.T) {
	id := consume.Identity{Node: "cmp1", AgentID: "cmp1", BatchSeq: 7}
	for _, tc := range []struct {
		name   string
		h      nats.Header
		errHas string // "" = accepted
	}{
		{"no headers (agents before them)", nats.Header{}, ""},
		{"its own", transport.BatchHeader("flow.v1", "lz4", "cmp1", 7, 3), ""},
		{"another agent", transport.BatchHeader("flow.v1", "lz4", "cmp2", 7, 3), `Tapflow-Agent "cmp2"`},
		{"another batch", transport.BatchHeader("flow.v1", "lz4", "cmp1", 8, 3), `Tapflow-Batch-Seq "8"`},
		{"another count", transport.BatchHeader("flow.v1", "lz4", "cmp1", 7, 4), `Tapflow-Records "4"`},
		{"a second value", nats.Header{transport.HeaderAgent: {"cmp1", "cmp2"}}, `Tapflow-Agent "cmp2"`},
		{"an empty value", nats.Header{transport.HeaderBatchSeq: {""}}, `Tapflow-Batch-Seq ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rej := consume.CheckHeaders(tc.h, id, 3)
			switch {
			case tc.errHas == "" && rej != nil:
				t.Fatalf("rejected: %v", rej)
			case tc.errHas != "" && (rej == nil || rej.Reason != consume.ReasonIdentity || !strings.Contains(rej.Err.Error(), tc.errHas)):
				t.Fatalf("got %v, want identity with %q", rej, tc.errHas)
			}
		})
	}
}
