package publish

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// A nats-server that is stopping can acknowledge a publish it then does
// not keep: Debian 12's nats-server 2.9.10, with the interest retention
// tapflow's streams use, acknowledged messages in the last milliseconds
// of a graceful shutdown that were gone after its restart (a publisher
// at full speed lost some in 16 of 95 restarts; the linked 2.15.2 in
// none of 15; TestChaosCollectorKilled/debian-2.9 lost 15 batches so).
// So the publisher keeps what JetStream acknowledged in the last
// resendWindow and publishes it again, with the same Nats-Msg-Id, once
// the connection comes back after a loss. A message the server did keep
// is a duplicate the stream drops; one the collector already consumed and
// the stream forgot across its restart is skipped by the collector's
// ledger.
const (
	// resendWindow: how long before a connection loss an acknowledged
	// message is still published again (the loss seen was within 15 ms
	// of the server's shutdown).
	resendWindow = time.Second
	// resendMaxBytes bounds the bodies kept of the current connection
	// (at a high rate the window shrinks to what fits, still well beyond
	// the loss seen) and, apart, those of connections since lost.
	resendMaxBytes = 4 << 20
)

// recentAck is one message JetStream acknowledged.
type recentAck struct {
	at      time.Time
	conn    uint64 // the connection's reconnect count when it was acked
	seq     int64
	id      string
	subject string
	body    []byte
	records int
}

// recentAcks keeps the messages acknowledged in the last resendWindow,
// oldest first. Safe for concurrent use (the publisher and the spool
// replayer both add).
//
// What the current connection acknowledged (current) is bounded by age
// and by resendMaxBytes: at a high rate the window shrinks to what fits.
// What an earlier connection acknowledged (earlier) is at risk — the loss
// ended it — and waits for acknowledgedBefore however long the outage, so
// the current connection's acks, the spool's replay among them, never
// push it out; it is bounded by resendMaxBytes of its own, which only a
// second loss before the publisher looks again can exceed (counted: add
// returns what it dropped).
type recentAcks struct {
	mu           sync.Mutex
	conn         uint64 // the newest reconnect count an ack came with
	current      []recentAck
	currentBytes int
	earlier      []recentAck
	earlierBytes int
	spare        [][]byte // bodies of evicted entries, reused
}

// add keeps a copy of msg, acknowledged at now on the connection whose
// reconnect count was conn. It returns how many acks of earlier
// connections it dropped unresent to stay within its bound.
func (r *recentAcks) add(now time.Time, conn uint64, msg *nats.Msg, id string, records int) (dropped int) {
	seq, err := strconv.ParseInt(id[strings.LastIndexByte(id, '-')+1:], 10, 64)
	if err != nil || len(msg.Data) > resendMaxBytes {
		return 0 // not a batch id this publisher makes; too large to keep
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if conn > r.conn {
		// The first ack since a reconnect: everything kept is at risk.
		r.earlier = append(r.earlier, r.current...)
		r.earlierBytes += r.currentBytes
		clear(r.current)
		r.current, r.currentBytes, r.conn = r.current[:0], 0, conn
	}
	var body []byte
	if n := len(r.spare); n > 0 {
		body, r.spare = r.spare[n-1][:0], r.spare[:n-1]
	}
	body = append(body, msg.Data...)
	e := recentAck{at: now, conn: conn, seq: seq, id: id, subject: msg.Subject, body: body, records: records}
	if conn < r.conn {
		// Acknowledged on a connection since lost (the replayer read the
		// count before the reconnect): at risk like the rest of it.
		r.earlier = append(r.earlier, e)
		r.earlierBytes += len(body)
	} else {
		r.current = append(r.current, e)
		r.currentBytes += len(body)
	}
	r.current, r.currentBytes, _ = r.evict(r.current, r.currentBytes, func(e *recentAck) bool { return now.Sub(e.at) > resendWindow })
	r.earlier, r.earlierBytes, dropped = r.evict(r.earlier, r.earlierBytes, nil)
	return dropped
}

// evict drops entries from the front of es, oldest first, while they are
// aged (aged may be nil) or es holds more than resendMaxBytes.
func (r *recentAcks) evict(es []recentAck, bytes int, aged func(*recentAck) bool) ([]recentAck, int, int) {
	drop := 0
	for drop < len(es) && (bytes > resendMaxBytes || (aged != nil && aged(&es[drop]))) {
		bytes -= len(es[drop].body)
		if len(r.spare) < 4 {
			r.spare = append(r.spare, es[drop].body)
		}
		drop++
	}
	if drop > 0 {
		n := copy(es, es[drop:])
		clear(es[n:])
		es = es[:n]
	}
	return es, bytes, drop
}

// acknowledgedBefore returns, and forgets, the messages kept that were
// acknowledged before the connection's last reconnect (reconnects: its
// count now), oldest connection first. The first connect of a connection
// that started without a server counts as a reconnect in nats.go, but
// nothing was acknowledged before it.
func (r *recentAcks) acknowledgedBefore(reconnects uint64) []recentAck {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.earlier
	r.earlier, r.earlierBytes = nil, 0
	if r.conn < reconnects && len(r.current) > 0 {
		// No ack yet on the connection now up: the last one's are at risk.
		out = append(out, r.current...)
		clear(r.current)
		r.current, r.currentBytes = r.current[:0], 0
	}
	return out
}
