package publish

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

const testAckBody = 64 << 10

// recentAcksUnderTest adds acks of testAckBody bytes and checks the keep's
// bounds after every one.
type recentAcksUnderTest struct {
	t       *testing.T
	r       recentAcks
	t0      time.Time
	seq     int
	dropped int
}

func (u *recentAcksUnderTest) add(at time.Duration, conn uint64, n int) (firstSeq int) {
	u.t.Helper()
	body := make([]byte, testAckBody)
	firstSeq = u.seq + 1
	for range n {
		u.seq++
		u.dropped += u.r.add(u.t0.Add(at), conn, &nats.Msg{Subject: "s", Data: body}, "agent-"+strconv.Itoa(u.seq), 1)
		if u.r.currentBytes > resendMaxBytes || u.r.earlierBytes > resendMaxBytes {
			u.t.Fatalf("after seq %d: %d bytes kept of the current connection, %d of earlier ones; cap %d each",
				u.seq, u.r.currentBytes, u.r.earlierBytes, resendMaxBytes)
		}
	}
	return firstSeq
}

// handedOver checks that acknowledgedBefore(reconnects) hands over exactly
// seqs from..to (0, 0: nothing), in order.
func (u *recentAcksUnderTest) handedOver(reconnects uint64, from, to int) {
	u.t.Helper()
	got := u.r.acknowledgedBefore(reconnects)
	want := 0
	if to > 0 {
		want = to - from + 1
	}
	if len(got) != want {
		u.t.Fatalf("acknowledgedBefore(%d) handed over %d acks, want %d (seqs %d..%d)", reconnects, len(got), want, from, to)
	}
	for i, e := range got {
		if e.seq != int64(from+i) {
			u.t.Fatalf("acknowledgedBefore(%d): ack %d is seq %d, want %d", reconnects, i, e.seq, from+i)
		}
	}
}

// TestRecentAcks: ten times resendMaxBytes through the kept acks leaves
// at most resendMaxBytes of the current connection and as much of the
// lost ones; what a lost connection acknowledged is neither aged out nor
// pushed out by the acks after the reconnect (the spool's replay can get
// more than resendMaxBytes acknowledged before the publisher looks);
// acknowledgedBefore hands over exactly the lost connections' acks, once.
func TestRecentAcks(t *testing.T) {
	perCap := resendMaxBytes / testAckBody
	tenTimes := 10 * perCap
	later := resendWindow + time.Second
	tests := []struct {
		name string
		run  func(u *recentAcksUnderTest)
	}{
		{"one connection keeps the newest that fit, hands over nothing", func(u *recentAcksUnderTest) {
			u.add(0, 0, tenTimes)
			if len(u.r.current) != perCap || u.r.current[len(u.r.current)-1].seq != int64(tenTimes) {
				u.t.Fatalf("kept %d acks, newest seq %d; want the newest %d", len(u.r.current), u.r.current[len(u.r.current)-1].seq, perCap)
			}
			u.handedOver(0, 0, 0)
		}},
		{"age evicts the current connection's acks", func(u *recentAcksUnderTest) {
			u.add(0, 0, 3)
			last := u.add(later, 0, 1)
			if len(u.r.current) != 1 || u.r.current[0].seq != int64(last) {
				u.t.Fatalf("kept %d acks, want only seq %d", len(u.r.current), last)
			}
		}},
		{"a lost connection's acks outlive the window and the replay after it", func(u *recentAcksUnderTest) {
			u.add(0, 0, tenTimes)
			first1 := u.add(later, 1, tenTimes) // the replay: ten times the cap, a window later
			u.handedOver(1, tenTimes-perCap+1, tenTimes)
			u.handedOver(1, 0, 0) // once
			if u.dropped != 0 {
				u.t.Fatalf("%d at-risk acks dropped", u.dropped)
			}
			// Connection 1's newest stay for the next loss.
			u.handedOver(2, first1+tenTimes-perCap, first1+tenTimes-1)
		}},
		{"a reconnect with no ack since hands over the last connection's", func(u *recentAcksUnderTest) {
			u.add(0, 0, 5)
			u.handedOver(1, 1, 5)
			u.handedOver(1, 0, 0)
		}},
		{"an ack read with the count before the reconnect is at risk too", func(u *recentAcksUnderTest) {
			u.add(0, 0, 2)
			u.add(0, 1, 1)
			u.add(0, 0, 1) // seq 4: the replayer read count 0, then the ack came
			got := u.r.acknowledgedBefore(1)
			if len(got) != 3 || got[0].seq != 1 || got[1].seq != 2 || got[2].seq != 4 {
				u.t.Fatalf("handed over %d acks, want seqs 1, 2, 4", len(got))
			}
		}},
		{"a second loss before the publisher looks drops the oldest, counted", func(u *recentAcksUnderTest) {
			u.add(0, 0, perCap)
			u.add(0, 1, perCap)
			u.add(0, 2, 1)
			if u.dropped != perCap {
				u.t.Fatalf("dropped %d at-risk acks, want %d (connection 0's)", u.dropped, perCap)
			}
			u.handedOver(2, perCap+1, 2*perCap)
		}},
		{"what is not a batch id or exceeds the cap is not kept", func(u *recentAcksUnderTest) {
			u.r.add(u.t0, 0, &nats.Msg{Data: make([]byte, 10)}, "no-seq-x", 1)
			u.r.add(u.t0, 0, &nats.Msg{Data: make([]byte, resendMaxBytes+1)}, "agent-1", 1)
			if len(u.r.current)+len(u.r.earlier) != 0 {
				u.t.Fatalf("%d acks kept, want 0", len(u.r.current)+len(u.r.earlier))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(&recentAcksUnderTest{t: t, t0: time.Unix(1700000000, 0)})
		})
	}
}
