package enrich

import (
	"time"

	"github.com/tapflow/tapflow/enrich/snapshot"
)

// heldRing is the late-binding buffer: held records oldest first, in a
// ring that grows up to the bound and never moves a record to make room.
// Evicting the oldest is O(1); only a pass that releases records from
// the middle (a new snapshot resolving some) moves the ones behind them.
type heldRing struct {
	buf     []heldRecord
	head, n int
	// version is the snapshot version every held record was last tried
	// against, when all were (tried); sorted says their arrival times
	// do not decrease from head to tail. Both true: the only records a
	// batch can release are the expired ones at the head.
	version int64
	tried   bool
	sorted  bool
	last    time.Time // arrival of the newest record
}

// at is the i-th oldest record (i < n).
func (q *heldRing) at(i int) *heldRecord {
	j := q.head + i
	if j >= len(q.buf) {
		j -= len(q.buf)
	}
	return &q.buf[j]
}

// pop removes the oldest record and returns it; the slot is cleared so
// the ring keeps no reference to a released record.
func (q *heldRing) pop() heldRecord {
	h := &q.buf[q.head]
	r := *h
	*h = heldRecord{}
	q.head++
	if q.head == len(q.buf) {
		q.head = 0
	}
	q.n--
	return r
}

// push appends h, growing the ring up to limit records; the caller
// evicts first when n == limit.
func (q *heldRing) push(h *heldRecord, limit int) {
	if q.n == len(q.buf) {
		q.grow(limit)
	}
	if q.n == 0 {
		q.sorted = true
	} else if h.at.Before(q.last) {
		q.sorted = false
	}
	q.last = h.at
	*q.at(q.n) = *h
	q.n++
}

func (q *heldRing) grow(limit int) {
	c := min(max(2*len(q.buf), 64), limit)
	if c <= len(q.buf) {
		c = len(q.buf) + 1 // limit below n: the caller's bug, but never lose a record
	}
	buf := make([]heldRecord, c)
	for i := range q.n {
		buf[i] = *q.at(i)
	}
	q.buf, q.head = buf, 0
}

// compact keeps, in order, the records keep says to; keep sees every
// record once, and those it refuses are cleared. Records before the first kept one are dropped by
// moving the head, so a prefix costs no copy.
func (q *heldRing) compact(keep func(h *heldRecord) bool) {
	base, w := 0, 0 // kept records are at [base, base+w)
	for i := range q.n {
		h := q.at(i)
		if !keep(h) {
			*h = heldRecord{}
			if w == 0 {
				base = i + 1
			}
			continue
		}
		if base+w != i {
			*q.at(base + w) = *h
			*h = heldRecord{}
		}
		w++
	}
	q.head = (q.head + base) % max(len(q.buf), 1)
	q.n = w
	q.sorted = true
	for i := 1; i < w; i++ {
		if q.at(i).at.Before(q.at(i - 1).at) {
			q.sorted = false
			break
		}
	}
}

// batchWork is what one Apply reuses from the last: the snapshot memo,
// the records it holds, and the VM MACs already asked for.
type batchWork struct {
	memo  snapshot.Memo
	hold  []heldRecord
	asked map[uint64]struct{} // VM MACs asked in this batch
}

// maxHoldScratch bounds the hold slice a batchWork keeps between
// batches: a cold start holds whole batches, and keeping that much would
// pin megabytes for good.
const maxHoldScratch = 1024

// askOnce reports whether mac was not yet asked in this batch, and
// notes it.
func (w *batchWork) askOnce(mac uint64) bool {
	if _, ok := w.asked[mac]; ok {
		return false
	}
	if w.asked == nil {
		w.asked = make(map[uint64]struct{})
	}
	w.asked[mac] = struct{}{}
	return true
}
