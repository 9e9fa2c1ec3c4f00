// Package usage turns a collector output into exact hourly usage for
// billing and publishes it where CloudKitty reads it (a Prometheus
// remote-write receiver, package billing/promwrite).
//
// An hour H = [H, H+1h) of time_end is closed at H+1h+settle. A closed
// hour is published only when `tapflow audit` (package internal/audit)
// passes for exactly that hour: Σ flow bytes = meter bytes − reported loss
// per node, tap and direction. An hour whose audit fails is held back:
// counted, logged with the audit's findings, and retried at every pass.
//
// Its totals are the exact bytes and packets per (project_id, zone,
// direction, external_network, lb_id), read the way `tapflow report`
// reads (package internal/report): every record of the hour's partition
// whose time_end is in [H, H+1h), each byte once (a member's copy of
// Octavia segment 2 carries lb_id none, as `report --by lb` counts).
//
// # Series and revisions
//
// Revision 0 of an hour is one sample per series at H+1h−1ms holding the
// hour's total (tapflow_billed_bytes, tapflow_billed_packets). When a late
// file changes the totals of a published hour, revision r ≥ 1 is one
// sample per changed series at H+1h−(r+1)ms holding the difference (new
// total − published total, possibly negative). So sum_over_time(m[3600s])
// at H+1h — what CloudKitty's Prometheus collector asks with
// aggregation_method sum — is always the hour's current exact total, and
// no sample ever reuses a timestamp with another value.
//
// # State
//
// A state directory keeps, per hour, what the receiver holds (totals,
// revision) and a fingerprint of the hour's files: a pass processes an
// hour again only when its files changed, it is held, or a write is
// pending. A revision is recorded as pending before it is written, so a
// crash between the write and the record re-sends the very same samples,
// which the receiver accepts as no-ops. Re-running is idempotent.
package usage

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/internal/audit"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/report"
)

// Metric names of the published series.
const (
	BytesMetric   = "tapflow_billed_bytes"
	PacketsMetric = "tapflow_billed_packets"
)

// None stands for an empty lb_id or external_network in a label
// (Prometheus drops empty labels); Unknown for an empty project.
const (
	None    = "none"
	Unknown = "unknown"
)

// Writer takes the samples of one revision (a *promwrite.Client).
type Writer interface {
	Write(ctx context.Context, series []promwrite.Series) error
}

// Corrector is told about a correction of an hour already published —
// or about an hour published for the first time after the rating side
// rated it (Options.RatedAfter) — so the rating side rates it again (billing/cloudkitty: POST
// /v2/task/reprocesses for each project over [hour, hour+1h)). An error
// is retried at the next pass.
type Corrector interface {
	Corrected(ctx context.Context, hour time.Time, projects []string) error
}

// Delivery is told that an hour's data, as its audit passed, is what the
// receiver now holds: after revision 0 and after each correction (a late
// file changed the hour), never for a held or open hour. It delivers the
// hour's data elsewhere (billing/flowlogs: each project's flow logs to its
// own S3 location) and must be idempotent: a crash between a delivery and
// its record delivers the hour again. An error is counted and retried at
// the next pass; it never changes the hour's publication.
type Delivery interface {
	Deliver(ctx context.Context, hour time.Time) error
}

// DeliveryFunc adapts a function to Delivery.
type DeliveryFunc func(ctx context.Context, hour time.Time) error

// Deliver calls f.
func (f DeliveryFunc) Deliver(ctx context.Context, hour time.Time) error { return f(ctx, hour) }

// Options configure a Publisher.
type Options struct {
	// Output is the collector output (a directory or s3://).
	Output *dataset.Output
	// Writer receives the samples.
	Writer Writer
	// StateDir keeps what was published per hour (created 0700).
	StateDir string
	// Settle: an hour is closed at its end + Settle.
	Settle time.Duration
	// Lookback: hours that ended longer ago are not looked at.
	Lookback time.Duration
	// Corrector, when set, is called after each correction, and after a
	// first publication RatedAfter or more after the hour's end.
	Corrector Corrector
	// RatedAfter is when the rating side has rated an hour, from its end
	// (CloudKitty: wait_periods × period). An hour first published later
	// (held back until its files arrived, a backlog) was rated without
	// it: the Corrector is told. 0: never.
	RatedAfter time.Duration
	// Delivery, when set, is called once per published revision of an
	// hour (its fingerprint), after the publication and the Corrector.
	Delivery Delivery
	// ClockSlack is the audit's (audit.DefaultClockSlack when zero).
	ClockSlack time.Duration
	Logger     *slog.Logger
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Publisher publishes closed, audited hours.
type Publisher struct {
	opts  Options
	state *stateStore
	m     *metrics
	log   *slog.Logger
	now   func() time.Time
}

// New validates opts and creates the state directory; it reads no data.
func New(opts Options) (*Publisher, error) {
	switch {
	case opts.Output == nil:
		return nil, errors.New("usage: no output to read")
	case opts.Writer == nil:
		return nil, errors.New("usage: no writer (billing.prometheus.url)")
	case opts.StateDir == "":
		return nil, errors.New("usage: no state directory (billing.state_dir)")
	case opts.Settle < 0:
		return nil, fmt.Errorf("usage: settle %s is negative", opts.Settle)
	case opts.Lookback < time.Hour:
		return nil, fmt.Errorf("usage: lookback %s is below 1h", opts.Lookback)
	}
	st, err := openState(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	p := &Publisher{opts: opts, state: st, m: newMetrics(), log: opts.Logger, now: opts.Now}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Collectors are the publisher's metrics, to register.
func (p *Publisher) Collectors() []prometheus.Collector { return p.m.collectors() }

// Close releases nothing today; the writer belongs to the caller.
func (p *Publisher) Close() error { return nil }

// Run runs a pass now and then every interval until ctx ends. Errors of a
// pass are logged and counted; the next pass retries.
func (p *Publisher) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("usage: interval %s is not positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := p.Pass(ctx); err != nil && ctx.Err() == nil {
			p.log.Error("billing pass failed; retrying at the next pass", "err", err, "next_in", interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Action says what processing an hour did.
type Action string

const (
	ActPublished Action = "published" // revision 0 written
	ActCorrected Action = "corrected" // a revision ≥ 1 written
	ActUnchanged Action = "unchanged" // nothing new to write
	ActHeld      Action = "held"      // audit failed: not published
	ActEmpty     Action = "empty"     // no record in the hour
	ActChanging  Action = "changing"  // files changed while it was read: next pass
	ActOpen      Action = "open"      // not closed yet
)

// Outcome is what happened to one hour.
type Outcome struct {
	Hour     time.Time
	Action   Action
	Revision int    // the hour's revision after processing (-1: none)
	Series   int    // series written by this processing
	Totals   Totals // the hour's totals as published (after processing)
	Findings []string
}

// Closed reports whether hour h (truncated) is closed at now.
func (p *Publisher) Closed(h time.Time) bool {
	return !p.now().Before(h.Add(time.Hour + p.opts.Settle))
}

// Pass processes, oldest first, every closed hour inside the lookback
// whose files changed since it was last processed, that is held, or has a
// pending write or correction. It returns what it did; an hour that fails
// (a refused write) is left for the next pass and the others go on; the
// error names every hour that failed.
func (p *Publisher) Pass(ctx context.Context) ([]Outcome, error) {
	p.m.passes.Inc()
	unlock, err := p.state.lock(ctx)
	if err != nil {
		p.m.passErrors.Inc()
		return nil, err
	}
	defer unlock()
	outs, err := p.pass(ctx)
	if err != nil {
		p.m.passErrors.Inc()
	}
	if herr := p.updateGauges(); err == nil {
		err = herr
	}
	return outs, err
}

func (p *Publisher) pass(ctx context.Context) ([]Outcome, error) {
	prints, err := p.fingerprints(ctx, p.window())
	if err != nil {
		return nil, err
	}
	now := p.now()
	oldest := now.Add(-p.opts.Lookback)
	states, err := p.state.all(oldest.Add(-time.Hour))
	if err != nil {
		return nil, err
	}
	todo := map[time.Time]bool{}
	for h := range prints {
		todo[h] = true
	}
	for _, st := range states {
		if st.Status == Held || st.Pending != nil || len(st.Unreprocessed) > 0 {
			todo[st.Hour] = true
		}
	}
	var hours []time.Time
	for h := range todo {
		if h.Add(time.Hour).After(oldest) && p.Closed(h) {
			hours = append(hours, h)
		}
	}
	slices.SortFunc(hours, func(a, b time.Time) int { return a.Compare(b) })
	var outs []Outcome
	var errs []error
	for _, h := range hours {
		if ctx.Err() != nil {
			return outs, errors.Join(append(errs, ctx.Err())...)
		}
		o, err := p.process(ctx, h, prints[h])
		if err != nil {
			p.log.Error("hour not processed; retried at the next pass", "hour", h.Format(hourLayout), "err", err)
			errs = append(errs, err)
			continue
		}
		if o.Action != ActUnchanged {
			outs = append(outs, o)
		}
	}
	return outs, errors.Join(errs...)
}

// Hour processes one hour, closed or not (the caller checks Closed), as
// a pass would: publishing it, correcting it or holding it back.
func (p *Publisher) Hour(ctx context.Context, h time.Time) (Outcome, error) {
	h = h.UTC().Truncate(time.Hour)
	unlock, err := p.state.lock(ctx)
	if err != nil {
		return Outcome{Hour: h}, err
	}
	defer unlock()
	prints, err := p.fingerprints(ctx, []time.Time{h})
	if err != nil {
		return Outcome{Hour: h}, err
	}
	o, err := p.process(ctx, h, prints[h])
	if herr := p.updateGauges(); err == nil {
		err = herr
	}
	return o, err
}

// Status returns every hour's state, oldest first.
func (p *Publisher) Status() ([]*HourState, error) { return p.state.all(time.Time{}) }

// fingerprints hashes, per hour of hours, the names and sizes of its
// committed flow and meter files (committed files are never rewritten: a
// new name is a new file); hours without files are left out. It lists the
// hours' partitions only, not the whole output (an S3 lake holds months).
func (p *Publisher) fingerprints(ctx context.Context, hours []time.Time) (map[time.Time]string, error) {
	out := make(map[time.Time]string, len(hours))
	for _, h := range hours {
		var list []string
		for _, dir := range []string{"flows", "meters"} {
			files, err := p.opts.Output.List(ctx, dir+"/"+h.UTC().Format("dt=2006-01-02/hour=15"))
			if errors.Is(err, dataset.ErrNoDir) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("usage: list %s: %w", dir, err)
			}
			for _, f := range files {
				list = append(list, fmt.Sprintf("%s %d", f.Rel, f.Size))
			}
		}
		if len(list) == 0 {
			continue
		}
		slices.Sort(list)
		sum := sha256.Sum256([]byte(strings.Join(list, "\n")))
		out[h] = fmt.Sprintf("%d:%s", len(list), hex.EncodeToString(sum[:12]))
	}
	return out, nil
}

// window lists the closed hours inside the lookback, oldest first.
func (p *Publisher) window() []time.Time {
	now := p.now()
	var hours []time.Time
	for h := now.Add(-p.opts.Lookback).UTC().Truncate(time.Hour); p.Closed(h); h = h.Add(time.Hour) {
		if h.Add(time.Hour).After(now.Add(-p.opts.Lookback)) {
			hours = append(hours, h)
		}
	}
	return hours
}

func (p *Publisher) process(ctx context.Context, h time.Time, print string) (Outcome, error) {
	st, err := p.state.load(h)
	if err != nil {
		return Outcome{Hour: h}, fmt.Errorf("usage: %w", err)
	}
	out := Outcome{Hour: h, Action: ActUnchanged}
	if st.Pending != nil {
		// A write whose outcome was not recorded: send the same samples
		// again (no-ops if they arrived), then record them.
		n, err := p.write(ctx, st, st.Pending.Totals, st.Pending.Revision)
		if err != nil {
			return out, err
		}
		out.Series += n
	}
	changed := st.Files != print || st.Status == Held
	if !changed {
		if err := p.reprocess(ctx, st); err != nil {
			return out, err
		}
		return p.outcome(out, st), p.deliver(ctx, st)
	}
	res, err := audit.Run(ctx, p.opts.Output, audit.Options{From: h, To: h.Add(time.Hour), ClockSlack: p.opts.ClockSlack})
	switch {
	case errors.Is(err, audit.ErrNoMeters):
		return p.hold(out, st, print, []string{err.Error()})
	case err != nil:
		return out, fmt.Errorf("usage: audit of %s: %w", h.Format(hourLayout), err)
	}
	switch res.Verdict() {
	case audit.Mismatched:
		f := make([]string, len(res.Mismatches))
		for i, m := range res.Mismatches {
			f[i] = m.String()
		}
		return p.hold(out, st, print, f)
	case audit.NothingChecked:
		// No record left (or none yet): nothing to bill; an hour published
		// before keeps what it published (files removed by retention are
		// not a correction).
		st.Status, st.Findings = Empty, nil
		if st.Revision >= 0 {
			st.Status = Published
		}
		st.Files = print
		if st.Revision >= 0 && p.opts.Delivery != nil {
			// Files removed by retention: what was delivered stays.
			st.Delivered = print
		}
		st.UpdatedAt = p.now().UTC()
		if err := p.state.save(st); err != nil {
			return out, fmt.Errorf("usage: %w", err)
		}
		if st.Revision < 0 {
			out.Action = ActEmpty
		}
		return p.outcome(out, st), nil
	}
	totals, err := p.totals(ctx, h)
	if err != nil {
		return out, err
	}
	// Nothing audited may be billed: a file that landed while the audit
	// and the totals were read waits for the next pass.
	again, err := p.fingerprints(ctx, []time.Time{h})
	if err != nil {
		return out, err
	}
	if again[h] != print {
		out.Action = ActChanging
		return p.outcome(out, st), nil
	}
	rev := st.Revision + 1
	if st.Revision >= 0 && len(diff(h, st.Totals, totals, rev)) == 0 {
		st.Status, st.Findings, st.Files, st.UpdatedAt = Published, nil, print, p.now().UTC()
		if err := p.state.save(st); err != nil {
			return out, fmt.Errorf("usage: %w", err)
		}
		return p.outcome(out, st), p.afterPublish(ctx, st)
	}
	st.Pending = &Pending{Revision: rev, Totals: totals}
	st.Files = print
	if err := p.state.save(st); err != nil {
		return out, fmt.Errorf("usage: %w", err)
	}
	n, err := p.write(ctx, st, totals, rev)
	out.Series += n
	if err != nil {
		return out, err
	}
	if rev == 0 {
		out.Action = ActPublished
	} else {
		out.Action = ActCorrected
	}
	return p.outcome(out, st), p.afterPublish(ctx, st)
}

// afterPublish tells the Corrector, then the Delivery.
func (p *Publisher) afterPublish(ctx context.Context, st *HourState) error {
	if err := p.reprocess(ctx, st); err != nil {
		return err
	}
	return p.deliver(ctx, st)
}

// undelivered reports whether the hour's published data waits for the
// Delivery: published, nothing pending, and its files (audited) not the
// ones delivered last.
func (p *Publisher) undelivered(st *HourState) bool {
	return p.opts.Delivery != nil && st.Status == Published && st.Pending == nil && st.Revision >= 0 && st.Delivered != st.Files
}

// deliver hands a published hour whose files changed since its last
// delivery to the Delivery. A failure is counted and logged, and the hour
// retried at the next pass; the publication is not touched.
func (p *Publisher) deliver(ctx context.Context, st *HourState) error {
	if !p.undelivered(st) {
		return nil
	}
	if err := p.opts.Delivery.Deliver(ctx, st.Hour); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("usage: delivery of %s: %w", st.Hour.Format(hourLayout), err)
		}
		p.m.deliveryErrors.Inc()
		p.log.Error("hour published but its delivery (flow logs) failed; retried at the next pass", "hour", st.Hour.Format(hourLayout), "revision", st.Revision, "err", err)
		return nil
	}
	st.Delivered, st.DeliveredAt = st.Files, p.now().UTC()
	if err := p.state.save(st); err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	p.m.delivered.Inc()
	return nil
}

func (p *Publisher) outcome(o Outcome, st *HourState) Outcome {
	o.Revision, o.Totals, o.Findings = st.Revision, st.Totals, st.Findings
	return o
}

// hold records a failed audit: not published, counted, logged; the hour
// keeps what it published before, if anything.
func (p *Publisher) hold(out Outcome, st *HourState, print string, findings []string) (Outcome, error) {
	p.m.held.Inc()
	shown := findings[:min(len(findings), 10)]
	p.log.Warn("closed hour held back: its conservation audit failed, so it is not published; retried at the next pass (tapflow audit --from H --to H+1h shows the same)",
		"hour", st.Hour.Format(hourLayout), "mismatches", len(findings), "findings", shown, "published_revision", st.Revision)
	st.Status, st.Findings, st.Files, st.UpdatedAt = Held, findings, print, p.now().UTC()
	if err := p.state.save(st); err != nil {
		return out, fmt.Errorf("usage: %w", err)
	}
	out.Action = ActHeld
	return p.outcome(out, st), nil
}

// write sends revision rev (the difference between what the receiver holds
// and totals) and records it.
func (p *Publisher) write(ctx context.Context, st *HourState, totals Totals, rev int) (int, error) {
	series := diff(st.Hour, st.Totals, totals, rev)
	if rev >= maxRevision {
		return 0, fmt.Errorf("usage: hour %s: revision %d: no timestamp left inside the hour", st.Hour.Format(hourLayout), rev)
	}
	if err := p.opts.Writer.Write(ctx, series); err != nil {
		p.m.publishErrors.Inc()
		return 0, fmt.Errorf("usage: publish %s revision %d (%d series): %w", st.Hour.Format(hourLayout), rev, len(series), err)
	}
	now := p.now().UTC()
	late := rev == 0 && p.opts.RatedAfter > 0 && now.Sub(st.Hour.Add(time.Hour)) >= p.opts.RatedAfter
	if rev > 0 || late {
		for _, pr := range changedProjects(st.Totals, totals) {
			if !slices.Contains(st.Unreprocessed, pr) {
				st.Unreprocessed = append(st.Unreprocessed, pr)
			}
		}
		slices.Sort(st.Unreprocessed)
	}
	st.Totals, st.Revision, st.Pending = totals, rev, nil
	st.Status, st.Findings, st.UpdatedAt = Published, nil, now
	if rev == 0 {
		st.PublishedAt = now
	}
	if err := p.state.save(st); err != nil {
		return len(series), fmt.Errorf("usage: %w", err)
	}
	b, pk := totals.Sum()
	if rev == 0 {
		p.m.published.Inc()
		p.m.lag.Set(now.Sub(st.Hour.Add(time.Hour)).Seconds())
		p.log.Info("hour published", "hour", st.Hour.Format(hourLayout), "series", len(series), "bytes", b, "packets", pk,
			"rated_already", late)
	} else {
		p.m.corrections.Inc()
		p.log.Info("hour corrected", "hour", st.Hour.Format(hourLayout), "revision", rev, "series", len(series), "bytes", b, "packets", pk, "projects", st.Unreprocessed)
	}
	return len(series), nil
}

// reprocess hands the projects of a correction to the Corrector.
func (p *Publisher) reprocess(ctx context.Context, st *HourState) error {
	if len(st.Unreprocessed) == 0 {
		return nil
	}
	if p.opts.Corrector == nil {
		st.Unreprocessed = nil
		return p.state.save(st)
	}
	if err := p.opts.Corrector.Corrected(ctx, st.Hour, st.Unreprocessed); err != nil {
		p.m.correctorErrors.Inc()
		p.log.Error("correction not taken by the rating side; retried at the next pass", "hour", st.Hour.Format(hourLayout), "projects", st.Unreprocessed, "err", err)
		return nil
	}
	st.Unreprocessed = nil
	if err := p.state.save(st); err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	return nil
}

func (p *Publisher) updateGauges() error {
	oldest := p.now().Add(-p.opts.Lookback)
	states, err := p.state.all(oldest.Add(-time.Hour))
	if err != nil {
		return err
	}
	held, undelivered := 0, 0
	var last time.Time
	for _, st := range states {
		if st.Status == Held && st.Hour.Add(time.Hour).After(oldest) {
			held++
		}
		if p.undelivered(st) && st.Hour.Add(time.Hour).After(oldest) {
			undelivered++
		}
		if st.Revision >= 0 && st.Hour.After(last) {
			last = st.Hour
		}
	}
	p.m.heldNow.Set(float64(held))
	p.m.undelivered.Set(float64(undelivered))
	if !last.IsZero() {
		p.m.lastPublishedHour.Set(float64(last.Add(time.Hour).Unix()))
	}
	return nil
}

// Dimensions are the report dimensions of a Key, in order.
var Dimensions = []string{"tenant", "zone", "direction", "external_network", "lb"}

// totals reads the hour's exact sums per key.
func (p *Publisher) totals(ctx context.Context, h time.Time) (Totals, error) {
	return HourTotals(ctx, p.opts.Output, h)
}

// HourTotals reads the exact sums per key of hour h from out, as
// `tapflow report --by tenant,zone,direction,external_network,lb --from H
// --to H+1h` does.
func HourTotals(ctx context.Context, out *dataset.Output, h time.Time) (Totals, error) {
	rep, err := report.ReadOutput(ctx, out, report.Options{By: Dimensions, From: h, To: h.Add(time.Hour)})
	if err != nil {
		return nil, fmt.Errorf("usage: totals of %s: %w", h.Format(hourLayout), err)
	}
	sums := map[Key]Total{}
	for _, r := range rep.Rows {
		k := Key{Project: cmp.Or(r.Keys[0], Unknown), Zone: r.Keys[1], Direction: r.Keys[2],
			ExternalNetwork: cmp.Or(r.Keys[3], None), LB: cmp.Or(r.Keys[4], None)}
		t := sums[k]
		t.Key = k
		t.Bytes += r.Bytes
		t.Packets += r.Packets
		sums[k] = t
	}
	out2 := make(Totals, 0, len(sums))
	for _, t := range sums {
		out2 = append(out2, t)
	}
	return out2.sorted(), nil
}

// maxRevision keeps every revision's timestamp inside the hour.
const maxRevision = 3600*1000 - 1

// SampleTime is the timestamp (ms) of revision rev of hour h: inside the
// hour, never at its start, one millisecond earlier per revision.
func SampleTime(h time.Time, rev int) int64 { return h.Add(time.Hour).UnixMilli() - int64(rev+1) }

// diff returns the series of revision rev: every key of to (rev 0), or
// the non-zero differences to − from (rev ≥ 1, keys gone count as 0).
func diff(h time.Time, from, to Totals, rev int) []promwrite.Series {
	ts := SampleTime(h, rev)
	old := from.index()
	if rev == 0 {
		old = nil
	}
	seen := map[Key]bool{}
	var out []promwrite.Series
	add := func(k Key, db, dp int64) {
		ls := labels(k)
		if rev == 0 || db != 0 {
			out = append(out, promwrite.NewSeries(BytesMetric, ls, promwrite.Sample{Value: float64(db), TimestampMs: ts}))
		}
		if rev == 0 || dp != 0 {
			out = append(out, promwrite.NewSeries(PacketsMetric, ls, promwrite.Sample{Value: float64(dp), TimestampMs: ts}))
		}
	}
	for _, t := range to {
		seen[t.Key] = true
		o := old[t.Key]
		add(t.Key, t.Bytes-o.Bytes, t.Packets-o.Packets)
	}
	if rev > 0 {
		for _, o := range from {
			if !seen[o.Key] {
				add(o.Key, -o.Bytes, -o.Packets)
			}
		}
	}
	return out
}

func labels(k Key) []promwrite.Label {
	return []promwrite.Label{{Name: "project_id", Value: k.Project}, {Name: "zone", Value: k.Zone}, {Name: "direction", Value: k.Direction},
		{Name: "external_network", Value: k.ExternalNetwork}, {Name: "lb_id", Value: k.LB}}
}

// changedProjects lists the projects whose totals differ between a and b.
func changedProjects(a, b Totals) []string {
	ia, ib := a.index(), b.index()
	set := map[string]bool{}
	for k, t := range ia {
		if u := ib[k]; u.Bytes != t.Bytes || u.Packets != t.Packets {
			set[k.Project] = true
		}
	}
	for k := range ib {
		if _, ok := ia[k]; !ok {
			set[k.Project] = true
		}
	}
	out := make([]string, 0, len(set))
	for pr := range set {
		out = append(out, pr)
	}
	slices.Sort(out)
	return out
}
