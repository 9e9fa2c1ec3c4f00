package consume_test

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// FuzzCheckHeaders: whatever batch headers a publisher sets (absent,
// repeated, any text), CheckHeaders accepts exactly when every value
// present is the records' own agent_id, batch_seq and count, and refuses
// anything else as an identity problem. A header it let through could
// make a subscriber skip another agent's real batch as a repeat.
func FuzzCheckHeaders(f *testing.F) {
	f.Add("cmp1", "", "7", "3", "cmp1", int64(7), 3)
	f.Add("cmp1", "cmp2", "7", "3", "cmp1", int64(7), 3)
	f.Add("", "", "07", "+3", "cmp1", int64(7), 3)
	f.Add("cmp1", "", "-9223372036854775808", "0", "cmp1", int64(-9223372036854775808), 0)
	f.Add("", "", "", "", "", int64(0), -1)
	f.Fuzz(func(t *testing.T, agent, agent2, seq, recs, idAgent string, idSeq int64, n int) {
		h := nats.Header{}
		for k, vs := range map[string][]string{transport.HeaderAgent: {agent, agent2}, transport.HeaderBatchSeq: {seq}, transport.HeaderRecords: {recs}} {
			for _, v := range vs {
				if v != "" { // "": the header left out, as agents before it did
					h.Add(k, v)
				}
			}
		}
		r := consume.CheckHeaders(h, consume.Identity{AgentID: idAgent, BatchSeq: idSeq}, n)
		want := map[string]string{transport.HeaderAgent: idAgent, transport.HeaderBatchSeq: strconv.FormatInt(idSeq, 10), transport.HeaderRecords: strconv.Itoa(n)}
		mismatch := ""
		for k, w := range want {
			for _, v := range h.Values(k) {
				if v != w {
					mismatch = k + " " + strconv.Quote(v)
				}
			}
		}
		switch {
		case r == nil && mismatch != "":
			t.Fatalf("accepted header %s for the batch %s-%d of %d records", mismatch, idAgent, idSeq, n)
		case r != nil && mismatch == "":
			t.Fatalf("refused headers %v that describe the batch %s-%d of %d records: %v", h, idAgent, idSeq, n, r)
		case r != nil && (r.Reason != consume.ReasonIdentity || r.Err == nil):
			t.Fatalf("refused as %q (%v), want %q with a cause", r.Reason, r.Err, consume.ReasonIdentity)
		}
	})
}
