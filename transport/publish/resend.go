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
	// resendMaxBytes bounds the bodies kept; at a high rate the window
	// shrinks to what fits (still well beyond the loss seen).
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
// at most resendMaxBytes of bodies, oldest first. Safe for concurrent use
// (the publisher and the spool replayer both add).
type recentAcks struct {
	mu      sync.Mutex
	entries []recentAck
	bytes   int
	spare   [][]byte // bodies of evicted entries, reused
}

// add keeps a copy of msg, acknowledged at now on the connection whose
// reconnect count was conn.
func (r *recentAcks) add(now time.Time, conn uint64, msg *nats.Msg, id string, records int) {
	seq, err := strconv.ParseInt(id[strings.LastIndexByte(id, '-')+1:], 10, 64)
	if err != nil || len(msg.Data) > resendMaxBytes {
		return // not a batch id this publisher makes; too large to keep
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var body []byte
	if n := len(r.spare); n > 0 {
		body, r.spare = r.spare[n-1][:0], r.spare[:n-1]
	}
	body = append(body, msg.Data...)
	r.entries = append(r.entries, recentAck{at: now, conn: conn, seq: seq, id: id, subject: msg.Subject, body: body, records: records})
	r.bytes += len(body)
	// Age evicts only what this connection acknowledged: what an earlier
	// one did waits for acknowledgedBefore, however long the outage.
	drop := 0
	for drop < len(r.entries) && ((r.entries[drop].conn == conn && now.Sub(r.entries[drop].at) > resendWindow) || r.bytes > resendMaxBytes) {
		r.bytes -= len(r.entries[drop].body)
		if len(r.spare) < 4 {
			r.spare = append(r.spare, r.entries[drop].body)
		}
		drop++
	}
	if drop > 0 {
		n := copy(r.entries, r.entries[drop:])
		clear(r.entries[n:])
		r.entries = r.entries[:n]
	}
}

// acknowledgedBefore returns, and forgets, the messages kept that were
// acknowledged before the connection's last reconnect (reconnects: its
// count now). The first connect of a connection that started without a
// server counts as a reconnect in nats.go, but nothing was acknowledged
// before it.
func (r *recentAcks) acknowledgedBefore(reconnects uint64) []recentAck {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) == 0 || r.entries[0].conn >= reconnects {
		return nil
	}
	var out, keep []recentAck
	for _, e := range r.entries {
		if e.conn < reconnects {
			out = append(out, e)
		} else {
			keep = append(keep, e)
			continue
		}
		r.bytes -= len(e.body)
	}
	r.entries = keep
	return out
}
