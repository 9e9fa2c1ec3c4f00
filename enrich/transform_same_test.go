package enrich

import (
	"context"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
)

// refEngine is the Engine's attribution as it was before the per-batch
// memo and the held-record ring: a lookup per record, a slice buffer that
// every batch copies whole. TestApplySameAsReference holds the Engine to
// its output, record for record.
type refEngine struct {
	cfg   Config
	late  []heldRecord
	asked []string // VM MACs passed to the asker, in order
}

func (e *refEngine) apply(ctx context.Context, s *snapshot.Snapshot, now time.Time, recs []schemas.Flow) []schemas.Flow {
	recs = e.attribute(s, now, recs)
	if ctx.Err() != nil {
		recs = append(recs, e.flush(s, now)...)
	}
	return recs
}

func (e *refEngine) attribute(s *snapshot.Snapshot, now time.Time, recs []schemas.Flow) []schemas.Flow {
	nowUS := now.UnixMicro()
	late := e.cfg.LateBinding.MaxRecords > 0
	var r snapshot.Result
	var in snapshot.Input
	w := 0
	var hold []heldRecord
	for i := range recs {
		f := &recs[i]
		_ = snapshot.FlowInput(f, nowUS, &in)
		s.AttributeInput(f, &in, nowUS, &r)
		if r.UnknownVM && late {
			hold = append(hold, heldRecord{f: *f, in: in, at: now, version: s.Version(), zone: r.Zone})
			e.asked = append(e.asked, f.VMMACText())
			continue
		}
		if w != i {
			recs[w] = *f
		}
		w++
	}
	recs = recs[:w]
	if len(hold) > 0 || len(e.late) > 0 {
		recs = e.release(s, now, hold, recs)
	}
	return recs
}

func (e *refEngine) release(s *snapshot.Snapshot, now time.Time, hold []heldRecord, out []schemas.Flow) []schemas.Flow {
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
				continue
			}
			h.f, h.zone = f, r.Zone
		}
		if now.Sub(h.at) >= window {
			out = append(out, h.f)
			continue
		}
		keep = append(keep, h)
	}
	keep = append(keep, hold...)
	if over := len(keep) - e.cfg.LateBinding.MaxRecords; over > 0 {
		out = append(out, func() []schemas.Flow {
			var o []schemas.Flow
			for _, h := range keep[:over] {
				o = append(o, h.f)
			}
			return o
		}()...)
		keep = append(keep[:0], keep[over:]...)
	}
	e.late = keep
	return out
}

func (e *refEngine) flush(s *snapshot.Snapshot, now time.Time) []schemas.Flow {
	nowUS := now.UnixMicro()
	out := make([]schemas.Flow, 0, len(e.late))
	var r snapshot.Result
	for _, h := range e.late {
		f := h.f
		s.AttributeInput(&f, &h.in, nowUS, &r)
		out = append(out, f)
	}
	e.late = nil
	return out
}

// setProvider serves the inventory a test sets, once per Set; guarded,
// so that a shrinking inventory is applied at once.
type setProvider struct {
	mu  sync.Mutex
	inv *inventory.Inventory
}

func (p *setProvider) Set(inv *inventory.Inventory) { p.mu.Lock(); p.inv = inv; p.mu.Unlock() }
func (p *setProvider) Guarded() bool                { return true }
func (p *setProvider) Poll(context.Context) (*inventory.Inventory, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	inv := p.inv
	p.inv = nil
	return inv, inv != nil, nil
}

// withoutPorts is inv without every k-th port.
func withoutPorts(inv *inventory.Inventory, k int) *inventory.Inventory {
	c := *inv
	c.Ports = nil
	for i, p := range inv.Ports {
		if i%k != 0 {
			c.Ports = append(c.Ports, p)
		}
	}
	return &c
}

// syntheticBatches are n batches of the synthetic source's records (the
// default cloud and traffic mix, binary and text forms filled), and its
// inventory.
func syntheticBatches(t *testing.T, n, size int) ([][]schemas.Flow, *inventory.Inventory) {
	t.Helper()
	cfg := synthetic.DefaultConfig()
	cfg.RecordsPerSecond, cfg.BatchRecords = 0, size
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	src, err := synthetic.New(cfg, synthetic.Options{Node: "cmp-17", Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *pipeline.Batch, 1)
	go func() { _ = src.Run(ctx, out); close(out) }()
	var batches [][]schemas.Flow
	for b := range out {
		if len(batches) < n {
			batches = append(batches, slices.Clone(b.Records))
		} else {
			cancel()
		}
		b.Ack(nil)
	}
	return batches, src.Inventory()
}

// TestApplySameAsReference: the Engine (memo, held ring, asker once per
// MAC) returns exactly what the per-record reference returns, every field
// of every record in order, batch after batch of the synthetic source,
// through inventory changes: a partial inventory (records held), the full
// one (held records resolve), the partial one again (ports become ghosts,
// then expire and their records are held again), late-binding windows
// running out, a full buffer evicting, a clock stepping back (arrival
// order no longer sorted), and the shutdown flush. The asker sees each
// MAC the reference asked for, once per batch.
func TestApplySameAsReference(t *testing.T) {
	batches, full := syntheticBatches(t, 8, 2048)
	partial := withoutPorts(full, 5)
	type step struct {
		inv   *inventory.Inventory // load first, when set
		clock time.Duration        // then move the clock
		batch int                  // then apply it
	}
	script := []step{
		{inv: partial, batch: 0}, {clock: time.Second, batch: 1}, {clock: time.Second, batch: 2},
		{inv: full, clock: time.Second, batch: 3}, // held records resolve
		{inv: partial, clock: time.Second, batch: 4},
		{clock: 61 * time.Second, batch: 5}, // ghosts expire (rebuilt on Load), windows of the first holds end
		{inv: partial, clock: 0, batch: 6},
		{clock: -30 * time.Second, batch: 7}, // the clock steps back
		{clock: 45 * time.Second, batch: 0},
		{inv: full, clock: 2 * time.Second, batch: 1},
		{clock: 90 * time.Second, batch: 2},
	}
	for _, c := range []struct {
		name       string
		maxRecords int
	}{{"defaults", DefaultConfig().LateBinding.MaxRecords}, {"small buffer evicts", 300}, {"late binding off", 0}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.LateBinding.MaxRecords = c.maxRecords
			clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			prov := &setProvider{}
			var mu sync.Mutex
			var asked []string
			e, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), WithProvider(prov), WithClock(clk.now),
				WithUnknownVM(func(mac string) { mu.Lock(); asked = append(asked, mac); mu.Unlock() }))
			if err != nil {
				t.Fatal(err)
			}
			ref := &refEngine{cfg: cfg}
			ctx := context.Background()
			held, resolved := 0, 0
			compare := func(i int, ctx context.Context, recs []schemas.Flow) {
				t.Helper()
				s, now := e.Snapshot(), clk.now()
				asked, ref.asked = nil, nil
				want := ref.apply(ctx, s, now, slices.Clone(recs))
				b := pipeline.NewBatch(slices.Clone(recs), nil)
				if err := e.Apply(ctx, b); err != nil {
					t.Fatal(err)
				}
				got := b.Records
				if len(got) != len(want) {
					t.Fatalf("step %d: %d records, reference %d", i, len(got), len(want))
				}
				for j := range got {
					if !reflect.DeepEqual(got[j], want[j]) {
						t.Fatalf("step %d record %d:\ngot  %+v\nwant %+v", i, j, got[j], want[j])
					}
				}
				if n := int(e.nHeld.Load()); n != len(ref.late) {
					t.Fatalf("step %d: %d held, reference %d", i, n, len(ref.late))
				}
				held = max(held, len(ref.late))
				uniq := slices.Compact(slices.Sorted(slices.Values(ref.asked)))
				if !slices.Equal(slices.Sorted(slices.Values(asked)), uniq) {
					t.Fatalf("step %d: asked %d MACs %v..., reference %d distinct", i, len(asked), asked[:min(3, len(asked))], len(uniq))
				}
			}
			for i, st := range script {
				if st.inv != nil {
					prov.Set(st.inv)
				}
				clk.add(st.clock)
				if err := e.Load(ctx); err != nil {
					t.Fatal(err)
				}
				before := len(ref.late)
				compare(i, ctx, batches[st.batch])
				if len(ref.late) < before {
					resolved++
				}
			}
			// shutdown: the last batch flushes what is held
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			compare(len(script), cctx, batches[3])
			if c.maxRecords > 0 && (held == 0 || resolved == 0) {
				t.Fatalf("the script never held (%d) or released (%d) records", held, resolved)
			}
			if e.nHeld.Load() != 0 {
				t.Fatalf("%d held after the flush", e.nHeld.Load())
			}
		})
	}
}
