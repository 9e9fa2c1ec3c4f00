package consume

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tapflow/tapflow/transport"
)

// Reasons a message is dead-lettered: the Tapflow-Reason header and the
// reason label of tapflow_consume_rejected_messages_total.
const (
	// ReasonPoison: delivered more than poison_deliveries times, and a
	// collector process died decoding it (poison.go); never decoded again.
	ReasonPoison = "poison"
	// ReasonDecode: not an Arrow IPC stream of the stream's schema.
	ReasonDecode = "decode"
	// ReasonSize: more bytes (decompressed) or records than
	// max_message_bytes / max_batch_records.
	ReasonSize = "size"
	// ReasonIdentity: the records do not belong to the message: node
	// differs from the subject's, Nats-Msg-Id is not <agent_id>-<batch_seq>
	// of every record, record_index is not 0..n-1, (agent_id_is_node)
	// agent_id is not the subject's node, or a batch header names another
	// batch (CheckHeaders).
	ReasonIdentity = "identity"
	// ReasonTime: a time_end outside [now − max_record_age, now +
	// max_clock_skew] (a skewed agent clock, or garbage that would become
	// a bogus partition).
	ReasonTime = "time"
	// ReasonEmpty: a message with no records (an empty body, or an Arrow
	// stream of no rows). Agents never publish one; acking it would let a
	// publisher burn message ids (another agent's <agent_id>-<batch_seq>
	// within the duplicate window) without a trace. Nothing to replay.
	ReasonEmpty = "empty"
)

// Reasons lists every reason, in the order they are checked.
var Reasons = []string{ReasonPoison, ReasonDecode, ReasonSize, ReasonEmpty, ReasonIdentity, ReasonTime}

// Identity is what the per-message checks read from one record.
type Identity struct {
	Node        string
	AgentID     string
	BatchSeq    int64
	RecordIndex int32
	TimeEnd     int64 // µs since epoch
}

// Limits bound one message's records (see Config).
type Limits struct {
	MaxRecords   int
	MaxRecordAge time.Duration
	MaxClockSkew time.Duration
	// AgentIDIsNode: agent_id must be the subject's node.
	AgentIDIsNode bool
}

// Rejection is a message that fails a check: the reason (one of Reasons)
// and what exactly is wrong.
type Rejection struct {
	Reason string
	Err    error
}

func (r *Rejection) Error() string { return r.Reason + ": " + r.Err.Error() }

func reject(reason, format string, a ...any) *Rejection {
	return &Rejection{Reason: reason, Err: fmt.Errorf(format, a...)}
}

// Check runs the per-message checks on the decoded records of one message
// received on subject with Nats-Msg-Id msgID, in order size, empty, identity,
// time; it returns the first failure, or nil. It reads each record once
// and allocates one bit per record.
func Check[T any](recs []T, ident func(*T) Identity, subject, msgID string, now time.Time, lim Limits) *Rejection {
	n := len(recs)
	if lim.MaxRecords > 0 && n > lim.MaxRecords {
		return reject(ReasonSize, "%d records, more than collector.max_batch_records %d", n, lim.MaxRecords)
	}
	if n == 0 {
		if msgID == "" {
			return reject(ReasonEmpty, "no records and no Nats-Msg-Id: an agent never publishes an empty batch")
		}
		return reject(ReasonEmpty, "no records under Nats-Msg-Id %q: an agent never publishes an empty batch; acked, it would burn that id for its owner within the duplicate window", msgID)
	}
	node := subject[strings.LastIndexByte(subject, '.')+1:]
	first := ident(&recs[0])
	wantID := first.AgentID + "-" + strconv.FormatInt(first.BatchSeq, 10)
	if first.AgentID == "" {
		return reject(ReasonIdentity, "record 0 has no agent_id")
	}
	if msgID != wantID {
		return reject(ReasonIdentity, "Nats-Msg-Id %q is not <agent_id>-<batch_seq> %q of its records", msgID, wantID)
	}
	lo := now.Add(-lim.MaxRecordAge).UnixMicro()
	hi := now.Add(lim.MaxClockSkew).UnixMicro()
	seen := make([]uint64, (n+63)/64)
	var timeErr *Rejection
	for i := range recs {
		id := ident(&recs[i])
		if id.Node != node {
			return reject(ReasonIdentity, "record %d has node %q, the subject %q says %q", i, id.Node, subject, node)
		}
		if id.AgentID != first.AgentID || id.BatchSeq != first.BatchSeq {
			return reject(ReasonIdentity, "record %d is %s-%d, record 0 is %s: one message carries one agent batch", i, id.AgentID, id.BatchSeq, wantID)
		}
		ri := int(id.RecordIndex)
		if ri < 0 || ri >= n || seen[ri/64]&(1<<(ri%64)) != 0 {
			return reject(ReasonIdentity, "record %d has record_index %d: indexes must be 0..%d, each once", i, id.RecordIndex, n-1)
		}
		seen[ri/64] |= 1 << (ri % 64)
		if timeErr == nil && (id.TimeEnd < lo || id.TimeEnd > hi) {
			timeErr = timeRejection(i, id.TimeEnd, now, lim)
		}
	}
	if lim.AgentIDIsNode && first.AgentID != node {
		return reject(ReasonIdentity, "records have agent_id %q, not the subject's node %q (collector.agent_id_is_node): an agent may only publish its own batches", first.AgentID, node)
	}
	// identity is checked on every record before a time failure counts:
	// a message that is not what it claims is an identity problem.
	return timeErr
}

// CheckHeaders checks the batch headers subscribers read before decoding
// and dedupe on (Tapflow-Agent, Tapflow-Batch-Seq, Tapflow-Records:
// docs/subscribers.md) against the records Check accepted: every value
// present must be the records' agent_id, batch_seq and count. A message
// whose headers name another agent's batch would make such a subscriber
// skip that agent's real batch as a repeat. Headers left out (agents
// before them) are not required.
func CheckHeaders(h nats.Header, first Identity, n int) *Rejection {
	for _, c := range []struct{ key, want string }{
		{transport.HeaderAgent, first.AgentID},
		{transport.HeaderBatchSeq, strconv.FormatInt(first.BatchSeq, 10)},
		{transport.HeaderRecords, strconv.Itoa(n)},
	} {
		for _, v := range h.Values(c.key) {
			if v != c.want {
				return reject(ReasonIdentity, "header %s %q, the records say %q: the batch headers must describe the message's own records", c.key, v, c.want)
			}
		}
	}
	return nil
}

func timeRejection(i int, te int64, now time.Time, lim Limits) *Rejection {
	t := time.UnixMicro(te).UTC()
	if d := t.Sub(now); d > 0 {
		return reject(ReasonTime, "record %d time_end %s is %s ahead of the collector's clock, more than collector.max_clock_skew %s: fix the agent's clock (NTP), or raise max_clock_skew, then `tapflow dlq replay --reason time`",
			i, t.Format(time.RFC3339Nano), d.Round(time.Second), lim.MaxClockSkew)
	}
	return reject(ReasonTime, "record %d time_end %s is %s old, more than collector.max_record_age %s: raise max_record_age to accept it, then `tapflow dlq replay --reason time`",
		i, t.Format(time.RFC3339Nano), age(now.Sub(t)), lim.MaxRecordAge)
}

// age prints d, in years when a garbage time_end saturates it.
func age(d time.Duration) string {
	const year = 365 * 24 * time.Hour
	if d > 10*year {
		return fmt.Sprintf("over %d years", d/year)
	}
	return d.Round(time.Second).String()
}
