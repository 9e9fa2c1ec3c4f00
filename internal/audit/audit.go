// Package audit checks byte conservation on a collector output: for every
// node, tap and direction and every hour, Σ flow.v1 bytes (packets) against
// Σ meter.v1 bytes (packets) minus the lost bytes (packets) the kernel
// reported. It is what `tapflow audit` runs, on a directory or an s3://
// output (package dataset).
//
// # Hours and their edges
//
// Flows and meters are partitioned by time_end, but a byte is counted by
// the meter at the first meter tick after its packet, and by a flow record
// when the flow is exported (active timeout, idle, FIN): a record that
// spans an hour boundary, and the meter interval that spans it, can put the
// same bytes on both sides. So the check is cumulative: per key, the running
// difference Σ flow − Σ (meter − lost) up to the end of each hour must be
// within what the records crossing that boundary can carry, and exactly zero
// at the end of the data. Bytes counted by a flow before the boundary and by
// a meter after it can only be in a meter interval crossing it, so the
// running difference may be positive up to the bytes of the meter records
// whose [time_start, time_end] crosses the boundary; bytes metered before
// and flowed after can only be in a flow record crossing it, so it may be
// negative down to minus their bytes (both with ClockSlack either side, for
// the kernel's coarse clock). Within an hour nothing can hide: a missing file or
// rows make the running difference exceed the carry at that hour, and the
// mismatch names the node, tap, direction and hour and the difference.
//
// # Nothing checked
//
// An audit that checked no key-hour passed nothing: an empty output, a
// range holding no record, or (the usual case right after a run) every
// hour newer than --settle. Its verdict is NothingChecked, never
// Conserved, and Result names the hours the range left out (LeftOut) and
// why, so `tapflow audit` exits with its own code (3) instead of 0.
//
// The lab runs it on every scenario (lab.RunConservation, next to its
// whole-run check per tap and direction); docs/queries.md has the same
// check as a DuckDB query (the compat module runs it on the same data).
package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/report"
	"github.com/tapflow/tapflow/schemas"
)

// DefaultClockSlack widens every boundary test: flow times come from the
// kernel's coarse monotonic clock mapped to wall time, meter times from the
// agent's wall clock.
const DefaultClockSlack = time.Second

// Options narrow the audit.
type Options struct {
	// From and To bound the hours checked (time_end in [From, To),
	// truncated to whole hours). Zero: open. A cut edge allows the carry of
	// the records crossing it, as an hour boundary does.
	From, To time.Time
	// ClockSlack: DefaultClockSlack when zero.
	ClockSlack time.Duration
	// Settle says how To was chosen, when it was: now − Settle, to the
	// hour (tapflow audit --settle). It only explains the hours at or
	// after To that are left out (Result.LeftOut).
	Settle time.Duration
}

// Key is one node, tap and direction.
type Key struct{ Node, Ifname, Direction string }

func (k Key) String() string { return k.Node + " " + k.Ifname + " " + k.Direction }

// Counts are byte and packet sums.
type Counts struct{ Bytes, Packets int64 }

// Hour is one key's figures for one hour (UTC, by time_end).
type Hour struct {
	Key
	Hour        time.Time
	Flow, Meter Counts
	Lost        Counts
	// Diff is Flow − (Meter − Lost) of this hour; Carry the running Diff
	// up to the end of the hour, which may be between −Below and +Above:
	// what the flow (meter) records crossing the hour's end can carry.
	Diff, Carry, Below, Above Counts
	// OK: −Below ≤ Carry ≤ Above for bytes and packets.
	OK bool
}

// Result is what Run found.
type Result struct {
	Output                    string
	FlowFiles, MeterFiles     int
	FlowRecords, MeterRecords int64
	Keys                      int
	Hours                     []Hour // sorted by key, then hour
	// Mismatches are the hours not OK, and keys with records of one
	// schema only.
	Mismatches []Mismatch
	Flow       Counts // totals over the checked hours
	Meter      Counts
	Lost       Counts
	// From, To and Settle are the Options the range came from.
	From, To time.Time
	Settle   time.Duration
	// LeftOut are the hours (UTC, by partition) holding flow or meter
	// files that the range left out, sorted: before From or at/after To.
	// The hour at To is read (its records may cross To) but not checked.
	LeftOut []time.Time
}

// Mismatch is one failed check.
type Mismatch struct {
	Key
	Hour time.Time // zero for a whole-key problem
	Text string
}

func (m Mismatch) String() string {
	if m.Hour.IsZero() {
		return fmt.Sprintf("node %s tap %s %s: %s", m.Node, m.Ifname, m.Direction, m.Text)
	}
	return fmt.Sprintf("node %s tap %s %s hour %s: %s", m.Node, m.Ifname, m.Direction, m.Hour.Format("2006-01-02T15Z"), m.Text)
}

// Verdict is an audit's outcome.
type Verdict int

const (
	// Conserved: at least one key-hour was checked and every check passed.
	Conserved Verdict = iota
	// Mismatched: some check failed (Mismatches).
	Mismatched
	// NothingChecked: no mismatch, but no key-hour was checked either: an
	// empty output, or no record in the range (LeftOut names the hours
	// the range left out). It proves nothing.
	NothingChecked
)

func (v Verdict) String() string {
	switch v {
	case Conserved:
		return "conserved"
	case Mismatched:
		return "mismatched"
	case NothingChecked:
		return "nothing checked"
	}
	return "invalid"
}

// Verdict is Mismatched when a check failed, else NothingChecked when no
// key-hour was checked, else Conserved.
func (r *Result) Verdict() Verdict {
	switch {
	case len(r.Mismatches) > 0:
		return Mismatched
	case len(r.Hours) == 0:
		return NothingChecked
	}
	return Conserved
}

// OK reports whether something was checked and every check passed: an
// audit that checked nothing is not OK.
func (r *Result) OK() bool { return r.Verdict() == Conserved }

// ErrNoMeters is returned when the output holds flow.v1 files but no
// meters/ (an output holding neither is NothingChecked).
var ErrNoMeters = errors.New("no meter.v1 files under meters/: the audit needs meters, which agents with source: ebpf write (synthetic sources have none)")

const hourUS = int64(time.Hour / time.Microsecond)

// Checker accumulates records and checks them (Run feeds it from an
// output; tests and the lab can feed it records directly).
type Checker struct {
	from, to int64 // hours checked: [from, to) in hours since the epoch
	slack    int64 // µs
	keys     map[Key]*keyState
	cutFrom  bool
	cutTo    bool
}

type keyState struct {
	hours map[int64]*Hour
	// boundary hour (its start) → bytes/packets of the flow (meter)
	// records crossing it
	nearFlow, nearMeter map[int64]*Counts
	flows               bool
	meter               bool
}

// NewChecker returns an empty checker for opts.
func NewChecker(opts Options) *Checker {
	c := &Checker{from: minInt, to: maxInt, slack: int64(cmp.Or(opts.ClockSlack, DefaultClockSlack) / time.Microsecond), keys: map[Key]*keyState{}}
	if !opts.From.IsZero() {
		c.from, c.cutFrom = floorDiv(opts.From.UnixMicro(), hourUS), true
	}
	if !opts.To.IsZero() {
		c.to, c.cutTo = ceilDiv(opts.To.UnixMicro(), hourUS), true
	}
	return c
}

const (
	minInt = -1 << 62
	maxInt = 1 << 62
)

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

func (c *Checker) state(k Key) *keyState {
	s := c.keys[k]
	if s == nil {
		s = &keyState{hours: map[int64]*Hour{}, nearFlow: map[int64]*Counts{}, nearMeter: map[int64]*Counts{}}
		c.keys[k] = s
	}
	return s
}

// cross adds n to every boundary within slack of [ts, te] (at most 48: a
// longer record is an outage's merged meter and the carry is bounded by
// its bytes anyway).
func (c *Checker) cross(near map[int64]*Counts, ts, te int64, n Counts) {
	lo := ceilDiv(ts-c.slack, hourUS)
	hi := floorDiv(te+c.slack, hourUS)
	for b := max(lo, hi-47); b <= hi; b++ {
		if ts < b*hourUS+c.slack && te >= b*hourUS-c.slack {
			p := near[b]
			if p == nil {
				p = &Counts{}
				near[b] = p
			}
			p.Bytes += n.Bytes
			p.Packets += n.Packets
		}
	}
}

// hour returns the Hour of k for time_end te, nil outside the range.
func (c *Checker) hour(s *keyState, k Key, te int64) *Hour {
	h := floorDiv(te, hourUS)
	if h < c.from || h >= c.to {
		return nil
	}
	x := s.hours[h]
	if x == nil {
		x = &Hour{Key: k, Hour: time.UnixMicro(h * hourUS).UTC()}
		s.hours[h] = x
	}
	return x
}

// AddFlow adds one flow record.
func (c *Checker) AddFlow(k Key, timeStart, timeEnd, bytes, packets int64) {
	s := c.state(k)
	s.flows = true
	c.cross(s.nearFlow, timeStart, timeEnd, Counts{bytes, packets})
	if h := c.hour(s, k, timeEnd); h != nil {
		h.Flow.Bytes += bytes
		h.Flow.Packets += packets
	}
}

// AddMeter adds one meter record.
func (c *Checker) AddMeter(k Key, timeStart, timeEnd int64, m, lost Counts) {
	s := c.state(k)
	s.meter = true
	c.cross(s.nearMeter, timeStart, timeEnd, m)
	if h := c.hour(s, k, timeEnd); h != nil {
		h.Meter.Bytes += m.Bytes
		h.Meter.Packets += m.Packets
		h.Lost.Bytes += lost.Bytes
		h.Lost.Packets += lost.Packets
	}
}

// Check computes the running differences and the mismatches.
func (c *Checker) Check() *Result {
	r := &Result{Keys: len(c.keys)}
	keys := make([]Key, 0, len(c.keys))
	for k := range c.keys {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Ifname, b.Ifname), cmp.Compare(a.Direction, b.Direction))
	})
	for _, k := range keys {
		s := c.keys[k]
		switch {
		case !s.meter && len(s.hours) > 0:
			// Flows in a checked hour with no meter record at all. (Flows
			// only in the hour read past an edge say nothing: their meters
			// may end in a partition beyond it, not read.)
			r.Mismatches = append(r.Mismatches, Mismatch{Key: k, Text: "flow records but no meter record: the agent of this node writes no meters (source: ebpf does), or its meter files are missing"})
		case !s.flows:
			var b int64
			for _, h := range s.hours {
				b += h.Meter.Bytes - h.Lost.Bytes
			}
			if b != 0 {
				r.Mismatches = append(r.Mismatches, Mismatch{Key: k, Text: fmt.Sprintf("meters count %d bytes (after loss) but there is no flow record of this tap: flow files are missing", b)})
			}
		}
		hours := make([]int64, 0, len(s.hours))
		for h := range s.hours {
			hours = append(hours, h)
		}
		slices.Sort(hours)
		if len(hours) == 0 {
			continue
		}
		last := hours[len(hours)-1]
		// The carry into the first hour, unknown when --from cut records:
		// it is within [−flows, +meters] crossing the first hour's start,
		// so what is computed from there may be off by its opposite.
		var startBelow, startAbove Counts
		if c.cutFrom {
			startBelow, startAbove = nearOf(s.nearMeter, hours[0]), nearOf(s.nearFlow, hours[0])
		}
		var carry Counts
		for _, hi := range hours {
			h := s.hours[hi]
			h.Diff = Counts{h.Flow.Bytes - (h.Meter.Bytes - h.Lost.Bytes), h.Flow.Packets - (h.Meter.Packets - h.Lost.Packets)}
			carry.Bytes += h.Diff.Bytes
			carry.Packets += h.Diff.Packets
			h.Carry = carry
			// The end of the data allows nothing, unless --to cut it.
			var below, above Counts
			if hi != last || c.cutTo {
				below, above = nearOf(s.nearFlow, hi+1), nearOf(s.nearMeter, hi+1)
			}
			h.Below = Counts{below.Bytes + startBelow.Bytes, below.Packets + startBelow.Packets}
			h.Above = Counts{above.Bytes + startAbove.Bytes, above.Packets + startAbove.Packets}
			h.OK = -h.Below.Bytes <= carry.Bytes && carry.Bytes <= h.Above.Bytes &&
				-h.Below.Packets <= carry.Packets && carry.Packets <= h.Above.Packets
			if !h.OK {
				r.Mismatches = append(r.Mismatches, Mismatch{Key: k, Hour: h.Hour, Text: h.explain()})
			}
			r.Flow.Bytes += h.Flow.Bytes
			r.Flow.Packets += h.Flow.Packets
			r.Meter.Bytes += h.Meter.Bytes
			r.Meter.Packets += h.Meter.Packets
			r.Lost.Bytes += h.Lost.Bytes
			r.Lost.Packets += h.Lost.Packets
			r.Hours = append(r.Hours, *h)
		}
	}
	return r
}

func (h *Hour) explain() string {
	return fmt.Sprintf("flows %d bytes / %d packets, meters %d / %d − lost %d / %d: difference %+d bytes / %+d packets this hour, %+d / %+d running, outside [-%d, +%d] bytes / [-%d, +%d] packets, what the records crossing the hour's end can carry",
		h.Flow.Bytes, h.Flow.Packets, h.Meter.Bytes, h.Meter.Packets, h.Lost.Bytes, h.Lost.Packets,
		h.Diff.Bytes, h.Diff.Packets, h.Carry.Bytes, h.Carry.Packets, h.Below.Bytes, h.Above.Bytes, h.Below.Packets, h.Above.Packets)
}

func nearOf(near map[int64]*Counts, b int64) Counts {
	if p := near[b]; p != nil {
		return *p
	}
	return Counts{}
}

// Run reads every committed flow.v1 and meter.v1 file of out and checks
// them. Partitions more than an hour outside [From, To) are not read (the
// hour next to a cut edge is: its records may cross the edge).
func Run(ctx context.Context, out *dataset.Output, opts Options) (*Result, error) {
	c := NewChecker(opts)
	meters, err := out.List(ctx, "meters")
	noMeters := errors.Is(err, dataset.ErrNoDir)
	if err != nil && !noMeters {
		return nil, err
	}
	flows, err := out.List(ctx, "flows")
	if err != nil && !errors.Is(err, dataset.ErrNoDir) { // meters without flows: every tap mismatches
		return nil, err
	}
	if noMeters && len(flows) > 0 {
		return nil, fmt.Errorf("%s: %w", out, ErrNoMeters)
	}
	var res Result
	for _, f := range meters {
		if !c.wants(f) {
			continue
		}
		n, err := dataset.ReadRows(ctx, out, f, schemas.MeterSchemaName, func(r *schemas.Meter) {
			c.AddMeter(Key{r.Node, r.Ifname, r.Direction}, r.TimeStart, r.TimeEnd, Counts{r.Bytes, r.Packets}, Counts{r.LostBytes, r.LostPackets})
		})
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		res.MeterFiles++
		res.MeterRecords += n
	}
	if len(flows) > 0 {
		if err := c.addFlows(ctx, out, &res); err != nil {
			return nil, err
		}
	}
	r := c.Check()
	r.Output = out.String()
	r.FlowFiles, r.MeterFiles, r.FlowRecords, r.MeterRecords = res.FlowFiles, res.MeterFiles, res.FlowRecords, res.MeterRecords
	r.From, r.To, r.Settle = opts.From, opts.To, opts.Settle
	r.LeftOut = c.leftOut(meters, flows)
	return r, nil
}

// leftOut returns the hours of the files' partitions outside the range,
// sorted and unique.
func (c *Checker) leftOut(lists ...[]dataset.File) []time.Time {
	seen := map[int64]bool{}
	for _, files := range lists {
		for _, f := range files {
			h, ok := partitionHour(f)
			if ok && (h < c.from || h >= c.to) {
				seen[h] = true
			}
		}
	}
	hours := make([]int64, 0, len(seen))
	for h := range seen {
		hours = append(hours, h)
	}
	slices.Sort(hours)
	out := make([]time.Time, len(hours))
	for i, h := range hours {
		out[i] = time.UnixMicro(h * hourUS).UTC()
	}
	return out
}

// addFlows sums the flow files with tapflow report's column reader, per
// node, tap, direction, hour of time_end, and the first and last hour
// boundary within slack of the record ([time_start, time_end] crosses the
// boundaries after (time_start − slack)'s hour up to (time_end + slack)'s),
// so no row is decoded whole.
func (c *Checker) addFlows(ctx context.Context, out *dataset.Output, res *Result) error {
	o := report.Options{Dims: []report.Dimension{
		{Name: "node", Column: "node"}, {Name: "ifname", Column: "ifname"}, {Name: "direction", Column: "direction"},
		{Name: "hour", Column: "hour", Bucket: time.Hour},
		{Name: "after", Column: "after", Bucket: time.Hour, Time: "time_start", Offset: -time.Duration(c.slack) * time.Microsecond},
		{Name: "upto", Column: "upto", Bucket: time.Hour, Time: "time_end", Offset: time.Duration(c.slack) * time.Microsecond},
	}}
	if c.from > minInt { // the hour before a cut is read: its records may cross it
		o.From = time.UnixMicro((c.from - 1) * hourUS)
	}
	if c.to < maxInt {
		o.To = time.UnixMicro((c.to + 1) * hourUS)
	}
	rep, err := report.ReadOutput(ctx, out, o)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	for _, r := range rep.Rows {
		var hv [3]int64
		for i, k := range r.Keys[3:] {
			if hv[i], err = strconv.ParseInt(k, 10, 64); err != nil {
				return fmt.Errorf("audit: bucket %q: %w", k, err)
			}
		}
		k := Key{r.Keys[0], r.Keys[1], r.Keys[2]}
		s := c.state(k)
		s.flows = true
		n := Counts{r.Bytes, r.Packets}
		for b := max(hv[1]+1, hv[2]-47); b <= hv[2]; b++ {
			p := s.nearFlow[b]
			if p == nil {
				p = &Counts{}
				s.nearFlow[b] = p
			}
			p.Bytes += n.Bytes
			p.Packets += n.Packets
		}
		if h := c.hour(s, k, hv[0]*hourUS); h != nil {
			h.Flow.Bytes += n.Bytes
			h.Flow.Packets += n.Packets
		}
	}
	res.FlowFiles, res.FlowRecords = rep.Files, rep.Total.Records
	return nil
}

// wants reports whether a file's partition is within an hour of the range.
func (c *Checker) wants(f dataset.File) bool {
	h, ok := partitionHour(f)
	return !ok || h >= c.from-1 && h <= c.to
}

// partitionHour is the hour (since the epoch) of a file's dt=/hour=
// partition; false when it has none.
func partitionHour(f dataset.File) (int64, bool) {
	t, err := time.Parse("dt=2006-01-02/hour=15", f.Partition())
	if err != nil {
		return 0, false
	}
	return floorDiv(t.UnixMicro(), hourUS), true
}
