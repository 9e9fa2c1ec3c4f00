package enrich

import (
	"context"
	"time"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

var _ pipeline.Transform = (*Engine)(nil)

// Apply implements pipeline.Transform: it attributes b.Records in place
// against the current snapshot. Records of unknown VM MACs are taken out
// of the batch into the late-binding buffer; held records that can now be
// attributed, or whose window is over, or that a full buffer pushes out,
// are appended to this batch. When ctx is done everything held is appended
// (as unknown — miss, or multicast — when still unknown), so shutdown
// loses nothing. Never
// fails.
func (e *Engine) Apply(ctx context.Context, b *pipeline.Batch) error {
	s := e.snap.Load()
	now := e.now()
	w := e.takeWork()
	b.Records = e.attribute(w, s, now, b.Records)
	if ctx.Err() != nil {
		b.Records = append(b.Records, e.flush(w)...)
	}
	e.putWork(w)
	e.noteApplied()
	return nil
}

// takeWork takes the reusable batch state (a new one when another Apply
// holds it: Apply may run concurrently, though the pipeline does not).
func (e *Engine) takeWork() *batchWork {
	if w := e.work.Swap(nil); w != nil {
		return w
	}
	return new(batchWork)
}

func (e *Engine) putWork(w *batchWork) {
	clear(w.hold) // no references to records already passed on
	w.hold = w.hold[:0]
	if cap(w.hold) > maxHoldScratch {
		w.hold = nil
	}
	if len(w.asked) > maxHoldScratch {
		w.asked = nil
	}
	e.work.Store(w)
}

// attribute stamps recs and returns them without the records it held,
// followed by released held records. The lookups go through w's memo:
// one per distinct MAC and address range, where the memo's gates find
// that it pays (snapshot.Memo). It does not allocate once w's
// hold slice and the late-binding buffer have grown.
func (e *Engine) attribute(w *batchWork, s *snapshot.Snapshot, now time.Time, recs []schemas.Flow) []schemas.Flow {
	nowUS := now.UnixMicro()
	late := e.cfg.LateBinding.MaxRecords > 0
	var zones [len(zoneIndex)]int
	var bad int
	var r snapshot.Result
	var in snapshot.Input
	hold := w.hold[:0]
	asked := false
	// records kept so far are recs[:n]; those from run on are kept in
	// place until a held record makes them move down as one copy
	n, run := 0, 0
	for i := range recs {
		f := &recs[i]
		if err := snapshot.FlowInput(f, nowUS, &in); err != nil {
			bad++
		}
		s.AttributeInputMemo(&w.memo, f, &in, nowUS, &r)
		if r.UnknownVM && late {
			hold = append(hold, heldRecord{f: *f, in: in, at: now, version: s.Version(), zone: r.Zone})
			if e.onUnknown != nil {
				if !asked {
					clear(w.asked)
					asked = true
				}
				if w.askOnce(in.VMMAC) { // once per MAC and batch: the asker's own window does the rest
					e.onUnknown(f.VMMACText())
				}
			}
			n = moveDown(recs, n, run, i)
			run = i + 1
			continue
		}
		zones[r.Zone]++
	}
	recs = recs[:moveDown(recs, n, run, len(recs))]
	w.hold = hold
	if len(hold) > 0 || e.nHeld.Load() > 0 {
		recs = e.release(&w.memo, s, now, hold, recs, &zones)
	}
	for z, n := range zones {
		if n > 0 {
			e.m.records[z].Add(float64(n))
		}
	}
	if bad > 0 {
		e.m.badRecords.Add(float64(bad))
	}
	return recs
}

// moveDown moves recs[from:to] to recs[n:] and returns the new count of
// records kept; no copy while nothing was taken out before them.
func moveDown(recs []schemas.Flow, n, from, to int) int {
	if n != from {
		copy(recs[n:], recs[from:to])
	}
	return n + to - from
}

// release re-attributes held records against s when s is newer than the
// snapshot they last tried, appends the resolved and the expired ones to
// out, adds hold, and evicts the oldest beyond the bound. While the
// snapshot is the one every held record already tried, only the oldest
// can be due (their window over), so it looks at those alone.
func (e *Engine) release(m *snapshot.Memo, s *snapshot.Snapshot, now time.Time, hold []heldRecord, out []schemas.Flow, zones *[len(zoneIndex)]int) []schemas.Flow {
	e.lateMu.Lock()
	defer e.lateMu.Unlock()
	nowUS := now.UnixMicro()
	window := e.cfg.LateBinding.Window.D()
	q := &e.late
	sv := s.Version()
	if q.tried && q.version == sv && q.sorted {
		for q.n > 0 && now.Sub(q.at(0).at) >= window {
			h := q.pop()
			out = append(out, h.f)
			zones[h.zone]++
			e.m.releasedWindow.Inc()
		}
	} else {
		var r snapshot.Result
		q.compact(func(h *heldRecord) bool {
			if h.version != sv {
				h.version = sv
				s.AttributeInputMemo(m, &h.f, &h.in, nowUS, &r)
				if !r.UnknownVM {
					out = append(out, h.f)
					zones[r.Zone]++
					e.m.resolved.Inc()
					return false
				}
				h.zone = r.Zone
			}
			if now.Sub(h.at) >= window {
				out = append(out, h.f)
				zones[h.zone]++
				e.m.releasedWindow.Inc()
				return false
			}
			return true
		})
	}
	q.version, q.tried = sv, true // hold tried s too
	limit := e.cfg.LateBinding.MaxRecords
	for i := range hold {
		if q.n >= limit { // full: the oldest goes, as unknown
			h := q.pop()
			out = append(out, h.f)
			zones[h.zone]++
			e.m.releasedFull.Inc()
		}
		q.push(&hold[i], limit)
	}
	e.nHeld.Store(int64(q.n))
	e.m.held.Set(float64(q.n))
	return out
}

// Flush removes and returns every held record, re-attributed against the
// current snapshot (tenant unknown, zone miss when still unknown). Call it
// at shutdown after the last Apply and emit the records.
func (e *Engine) Flush() []schemas.Flow {
	w := e.takeWork()
	defer e.putWork(w)
	return e.flush(w)
}

func (e *Engine) flush(w *batchWork) []schemas.Flow {
	s := e.snap.Load()
	nowUS := e.now().UnixMicro()
	e.lateMu.Lock()
	defer e.lateMu.Unlock()
	q := &e.late
	out := make([]schemas.Flow, 0, q.n)
	var r snapshot.Result
	for q.n > 0 {
		h := q.pop()
		s.AttributeInputMemo(&w.memo, &h.f, &h.in, nowUS, &r)
		if r.UnknownVM {
			e.m.releasedFlush.Inc()
		} else {
			e.m.resolved.Inc()
		}
		e.m.records[r.Zone].Inc()
		out = append(out, h.f)
	}
	e.late = heldRing{}
	e.nHeld.Store(0)
	e.m.held.Set(0)
	return out
}
