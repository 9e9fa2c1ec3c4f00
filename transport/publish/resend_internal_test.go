package publish

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestRecentAcksBounded: ten times resendMaxBytes through the kept acks
// leaves at most resendMaxBytes; age evicts only the current connection's
// acks; acknowledgedBefore hands over exactly the earlier connections'
// acks, once.
func TestRecentAcksBounded(t *testing.T) {
	body := make([]byte, 64<<10)
	msg := func() *nats.Msg { return &nats.Msg{Subject: "s", Data: body} }
	t0 := time.Unix(1700000000, 0)
	var r recentAcks
	n := 10 * resendMaxBytes / len(body)
	for i := range n {
		r.add(t0.Add(time.Duration(i)*time.Microsecond), 0, msg(), "agent-"+strconv.Itoa(i+1), 1)
		if r.bytes > resendMaxBytes {
			t.Fatalf("after %d adds: %d bytes kept, cap %d", i+1, r.bytes, resendMaxBytes)
		}
	}
	if want := resendMaxBytes / len(body); len(r.entries) != want {
		t.Fatalf("%d entries kept, want %d (the newest)", len(r.entries), want)
	}
	if got := r.entries[len(r.entries)-1].seq; got != int64(n) {
		t.Fatalf("newest kept seq %d, want %d", got, n)
	}
	if got := r.acknowledgedBefore(0); got != nil {
		t.Fatalf("%d handed over with no reconnect", len(got))
	}

	// A reconnect (count 1): one ack on the new connection a window later
	// ages out nothing of connection 0's.
	r.add(t0.Add(resendWindow+time.Second), 1, msg(), "agent-900", 1)
	before := r.acknowledgedBefore(1)
	if len(before) != resendMaxBytes/len(body)-1 { // one made room for the new ack
		t.Fatalf("%d acks of connection 0 handed over, want %d", len(before), resendMaxBytes/len(body)-1)
	}
	for _, e := range before {
		if e.conn != 0 {
			t.Fatalf("an ack of connection %d handed over", e.conn)
		}
	}
	if len(r.entries) != 1 || r.entries[0].seq != 900 || r.bytes != len(body) {
		t.Fatalf("kept %d entries (%d bytes), want only seq 900", len(r.entries), r.bytes)
	}
	if got := r.acknowledgedBefore(1); got != nil {
		t.Fatalf("handed over twice: %d", len(got))
	}
	// On the current connection, age evicts.
	r.add(t0.Add(2*resendWindow+2*time.Second), 1, msg(), "agent-901", 1)
	if len(r.entries) != 1 || r.entries[0].seq != 901 {
		t.Fatalf("an ack older than resendWindow on the current connection kept: %d entries", len(r.entries))
	}
	// What is not a batch id, or is larger than the cap, is not kept.
	r.add(t0.Add(2*resendWindow+2*time.Second), 1, msg(), "no-seq-x", 1)
	r.add(t0.Add(2*resendWindow+2*time.Second), 1, &nats.Msg{Data: make([]byte, resendMaxBytes+1)}, "agent-902", 1)
	if len(r.entries) != 1 {
		t.Fatalf("%d entries after two that must not be kept", len(r.entries))
	}
}
