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
	b.Records = e.attribute(s, now, b.Records)
	if ctx.Err() != nil {
		b.Records = append(b.Records, e.Flush()...)
	}
	e.noteApplied()
	return nil
}

// attribute stamps recs and returns them without the records it held,
// followed by released held records. Only the hold path allocates.
func (e *Engine) attribute(s *snapshot.Snapshot, now time.Time, recs []schemas.Flow) []schemas.Flow {
	nowUS := now.UnixMicro()
	late := e.cfg.LateBinding.MaxRecords > 0
	var zones [len(zoneIndex)]int
	var bad int
	var r snapshot.Result
	var in snapshot.Input
	w := 0
	var hold []heldRecord
	for i := range recs {
		f := &recs[i]
		if err := snapshot.FlowInput(f, nowUS, &in); err != nil {
			bad++
		}
		s.AttributeInput(f, &in, nowUS, &r)
		if r.UnknownVM && late {
			hold = append(hold, heldRecord{f: *f, in: in, at: now, version: s.Version(), zone: r.Zone})
			if e.onUnknown != nil {
				e.onUnknown(f.VMMACText())
			}
			continue
		}
		zones[r.Zone]++
		if w != i {
			recs[w] = *f
		}
		w++
	}
	recs = recs[:w]
	if len(hold) > 0 || e.nHeld.Load() > 0 {
		recs = e.release(s, now, hold, recs, &zones)
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

// release re-attributes held records against s when s is newer than the
// snapshot they last tried, appends the resolved and the expired ones to
// out, adds hold, and evicts the oldest beyond the bound.
func (e *Engine) release(s *snapshot.Snapshot, now time.Time, hold []heldRecord, out []schemas.Flow, zones *[len(zoneIndex)]int) []schemas.Flow {
	e.lateMu.Lock()
	defer e.lateMu.Unlock()
	nowUS := now.UnixMicro()
	window := e.cfg.LateBinding.Window.D()
	var r snapshot.Result
	keep := e.late[:0]
	for _, h := range e.late {
		if h.version != s.Version() {
			h.version = s.Version()
			f := h.f
			s.AttributeInput(&f, &h.in, nowUS, &r)
			if !r.UnknownVM {
				out = append(out, f)
				zones[r.Zone]++
				e.m.resolved.Inc()
				continue
			}
			h.f, h.zone = f, r.Zone
		}
		if now.Sub(h.at) >= window {
			out = append(out, h.f)
			zones[h.zone]++
			e.m.releasedWindow.Inc()
			continue
		}
		keep = append(keep, h)
	}
	keep = append(keep, hold...)
	if over := len(keep) - e.cfg.LateBinding.MaxRecords; over > 0 {
		for _, h := range keep[:over] {
			out = append(out, h.f)
			zones[h.zone]++
			e.m.releasedFull.Inc()
		}
		keep = append(keep[:0], keep[over:]...)
	}
	if len(keep) < len(e.late) {
		clear(e.late[len(keep):]) // drop references to released records
	}
	e.late = keep
	e.nHeld.Store(int64(len(keep)))
	e.m.held.Set(float64(len(keep)))
	return out
}

// Flush removes and returns every held record, re-attributed against the
// current snapshot (tenant unknown, zone miss when still unknown). Call it
// at shutdown after the last Apply and emit the records.
func (e *Engine) Flush() []schemas.Flow {
	s := e.snap.Load()
	nowUS := e.now().UnixMicro()
	e.lateMu.Lock()
	defer e.lateMu.Unlock()
	out := make([]schemas.Flow, 0, len(e.late))
	var r snapshot.Result
	for _, h := range e.late {
		f := h.f
		s.AttributeInput(&f, &h.in, nowUS, &r)
		if r.UnknownVM {
			e.m.releasedFlush.Inc()
		} else {
			e.m.resolved.Inc()
		}
		e.m.records[r.Zone].Inc()
		out = append(out, f)
	}
	e.late = nil
	e.nHeld.Store(0)
	e.m.held.Set(0)
	return out
}
