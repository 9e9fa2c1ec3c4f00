package transport

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"time"
)

// DLQEvictions is the tally of one sender's dead letters a collector
// evicted to keep the sender within collector.dlq_letters_per_node. It is
// the JSON body of the last message on DLQEvictedSubject: the collectors
// update it (read, add, publish expecting the subject's last sequence),
// `tapflow dlq inspect` shows it.
type DLQEvictions struct {
	Sender   string            `json:"sender"`
	Stream   string            `json:"stream"`    // the letters' original stream
	Letters  uint64            `json:"letters"`   // evicted letters
	Bytes    uint64            `json:"bytes"`     // their bodies
	Records  uint64            `json:"records"`   // records in those that decoded
	ByReason map[string]uint64 `json:"by_reason"` // letters per Tapflow-Reason
	First    time.Time         `json:"first"`     // first eviction
	Last     time.Time         `json:"last"`      // latest eviction
	// LastMsgID is the original Nats-Msg-Id of the latest evicted letter.
	LastMsgID string `json:"last_msg_id,omitempty"`
}

// DecodeDLQEvictions reads a tally's JSON body (what any publisher on the
// tally subject may have put there).
func DecodeDLQEvictions(body []byte) (DLQEvictions, error) {
	var e DLQEvictions
	if err := json.Unmarshal(body, &e); err != nil {
		return DLQEvictions{}, fmt.Errorf("not an eviction tally: %w", err)
	}
	return e, nil
}

// Add merges o into e. Counts saturate: a tally near the top of uint64
// (a forged or corrupt one) stays there instead of wrapping to a small
// number that would hide evictions.
func (e *DLQEvictions) Add(o DLQEvictions) {
	if e.Sender == "" {
		e.Sender, e.Stream = o.Sender, o.Stream
	}
	e.Letters = addSat(e.Letters, o.Letters)
	e.Bytes = addSat(e.Bytes, o.Bytes)
	e.Records = addSat(e.Records, o.Records)
	if e.ByReason == nil {
		e.ByReason = map[string]uint64{}
	}
	for r, n := range maps.All(o.ByReason) {
		e.ByReason[r] = addSat(e.ByReason[r], n)
	}
	if e.First.IsZero() || (!o.First.IsZero() && o.First.Before(e.First)) {
		e.First = o.First
	}
	if o.Last.After(e.Last) {
		e.Last, e.LastMsgID = o.Last, o.LastMsgID
	}
}

func addSat(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
