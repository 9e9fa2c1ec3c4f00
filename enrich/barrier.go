package enrich

import (
	"context"
	"errors"
	"time"
)

// Exporter is a source that can export every record of traffic it has
// seen so far (bpf/source: every live kernel flow, end_reason
// inventory_change). batches is how many batches the source had sent
// downstream by the end of the export, counted from its start; the
// Engine must be the first stage after that source, so that its Apply
// sees each of them once and in order.
type Exporter interface {
	ExportLive(ctx context.Context) (batches uint64, err error)
}

// DefaultBarrierTimeout bounds one swap barrier: the export and the
// attribution of what it exported.
const DefaultBarrierTimeout = 30 * time.Second

// Results of tapflow_enrich_swap_barriers_total.
const (
	barrierOK      = "ok"      // exported and attributed against the old snapshot, then swapped
	barrierSkipped = "skipped" // the new snapshot only adds: swapped at once
	barrierTimeout = "timeout" // not done within the bound: swapped anyway
	barrierError   = "error"   // the export failed: swapped anyway
)

var barrierResults = []string{barrierOK, barrierSkipped, barrierTimeout, barrierError}

// WithExporter turns on the swap barrier (timeout ≤ 0: DefaultBarrierTimeout).
// Before the Engine swaps in a snapshot that attributes some record
// differently (snapshot.Changed: a change or removal, not a pure
// addition), it asks x to export every live record, attributes those
// batches against the old snapshot, and swaps once Apply has taken as
// many batches as x reported. So a record of traffic that flowed before
// the swap is attributed with the inventory the swap replaced, not with
// the one current when the kernel would have exported it (a UDP flow at
// its idle timeout, a long flow at its active timeout).
//
// The barrier never holds Apply: it waits in the reload loop while Apply
// runs on. A failed export, or one that takes longer than timeout
// together with its attribution (a blocked downstream), swaps anyway;
// tapflow_enrich_swap_barriers_total{result} counts every outcome.
func WithExporter(x Exporter, timeout time.Duration) Option {
	return func(e *Engine) {
		e.exporter = x
		e.barrierTimeout = timeout
		if timeout <= 0 {
			e.barrierTimeout = DefaultBarrierTimeout
		}
	}
}

// noteApplied counts one applied batch (after its records were stamped)
// and wakes a waiting barrier. Never blocks.
func (e *Engine) noteApplied() {
	if e.exporter == nil {
		return
	}
	e.applied.Add(1)
	select {
	case e.appliedSig <- struct{}{}:
	default:
	}
}

// barrier runs before a swap from prev (loadMu held). why is the change
// snapshot.Changed found; "" skips the barrier.
func (e *Engine) barrier(parent context.Context, why string, version int64) {
	if e.exporter == nil {
		return
	}
	if why == "" {
		e.m.barriers.WithLabelValues(barrierSkipped).Inc()
		return
	}
	start := time.Now()
	// A stopping reload loop (parent done) ends the wait at once,
	// counted as a timeout: the agent's stop never waits for it.
	ctx, cancel := context.WithTimeout(parent, e.barrierTimeout)
	defer cancel()
	result, err := e.exportAndWait(ctx)
	e.m.barriers.WithLabelValues(result).Inc()
	e.m.barrierSeconds.Observe(time.Since(start).Seconds())
	if result != barrierOK {
		e.log.Warn("swap barrier incomplete: swapping anyway; records of live flows not yet attributed take the new snapshot",
			"result", result, "version", version, "change", why, "took", time.Since(start).Round(time.Millisecond), "err", err)
		return
	}
	e.log.Info("swap barrier: live flows exported and attributed against the previous snapshot", "version", version,
		"change", why, "took", time.Since(start).Round(time.Millisecond))
}

func (e *Engine) exportAndWait(ctx context.Context) (string, error) {
	n, err := e.exporter.ExportLive(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return barrierTimeout, err
		}
		return barrierError, err
	}
	for e.applied.Load() < n {
		select {
		case <-e.appliedSig:
		case <-ctx.Done():
			return barrierTimeout, errors.New("exported batches not attributed within the bound (downstream blocked?)")
		}
	}
	return barrierOK, nil
}
