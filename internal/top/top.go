// Package top turns scrapes of tapflow /metrics endpoints (the Prometheus
// text format, parsed with prometheus/common/expfmt) into a per-stage view:
// records/s in and out, discards/s, errors, edge queue depth and the age of
// the oldest unacked batch (the stage's lag), one row per endpoint,
// pipeline and stage, plus the backlog, spool and loss figures an operator
// looks at next. It is what `tapflow top` draws; rates are the counter
// increase between two scrapes of the same endpoint divided by the time
// between them.
//
// Which metric is which column (all from package pipeline's standard
// series, labelled pipeline and stage):
//
//	in/s      rate of tapflow_stage_received_records_total
//	out/s     rate of tapflow_stage_sent_records_total (sinks: made durable)
//	drop/s    rate of tapflow_stage_discarded_records_total (all reasons)
//	errors    tapflow_stage_errors_total (and its rate)
//	queue     tapflow_edge_queue_batches (batches waiting on the edge into the stage)
//	lag       tapflow_stage_oldest_pending_seconds (oldest batch the sink has not acked)
//
// The source has no stage series: its row's out/s is the rate of
// tapflow_synthetic_records_total or tapflow_capture_records_total.
package top

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one scrape of one endpoint.
type Sample struct {
	Endpoint string
	At       time.Time
	Err      error
	Families map[string]*dto.MetricFamily
}

// maxBody bounds a scrape (a tapflow endpoint serves tens of kB).
const maxBody = 16 << 20

// Scrape fetches url (a /metrics endpoint) and parses it. A failed scrape
// is a Sample with Err set, so one endpoint down does not hide the others.
func Scrape(ctx context.Context, c *http.Client, url string) *Sample {
	s := &Sample{Endpoint: url, At: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		s.Err = err
		return s
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		s.Err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.Err = fmt.Errorf("%s", resp.Status)
		return s
	}
	s.Families, s.Err = Parse(io.LimitReader(resp.Body, maxBody))
	return s
}

// Parse reads the Prometheus text format.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return mfs, nil
}

// StageKey names a row.
type StageKey struct{ Endpoint, Pipeline, Stage string }

// Row is one stage's figures.
type Row struct {
	StageKey
	In, Out, Drop float64 // records/s
	Errors        float64 // total
	ErrRate       float64 // per second
	Queue         float64 // batches
	Lag           float64 // seconds; NaN when the stage has no sink gauge
}

// Extra is one endpoint-wide figure (backlog, spool, loss).
type Extra struct {
	Endpoint, Name, Value string
}

// View is one screen.
type View struct {
	At       time.Time
	Interval time.Duration // between the two scrapes of the rates
	Rows     []Row
	Extras   []Extra
	Errors   []string // endpoints that failed
}

// Compute builds the view from the previous and current scrapes of the
// same endpoints (prev may miss some: their rates show 0 until the next).
func Compute(prev, cur []*Sample) View {
	v := View{At: time.Now()}
	before := map[string]*Sample{}
	for _, s := range prev {
		if s != nil && s.Err == nil {
			before[s.Endpoint] = s
		}
	}
	for _, s := range cur {
		if s.Err != nil {
			v.Errors = append(v.Errors, fmt.Sprintf("%s: %v", s.Endpoint, s.Err))
			continue
		}
		p := before[s.Endpoint]
		var dt float64
		if p != nil {
			dt = s.At.Sub(p.At).Seconds()
			v.Interval = max(v.Interval, s.At.Sub(p.At))
		}
		rows := map[StageKey]*Row{}
		row := func(m *dto.Metric) *Row {
			k := StageKey{Endpoint: s.Endpoint, Pipeline: label(m, "pipeline"), Stage: label(m, "stage")}
			r := rows[k]
			if r == nil {
				r = &Row{StageKey: k, Lag: math.NaN()}
				rows[k] = r
			}
			return r
		}
		rate := func(name string, set func(*Row, float64)) {
			for _, m := range metrics(s, name) {
				r := row(m)
				if p == nil || dt <= 0 {
					set(r, 0)
					continue
				}
				d := value(m) - find(p, name, m)
				if d < 0 { // counter reset (restart)
					d = value(m)
				}
				set(r, d/dt)
			}
		}
		rate("tapflow_stage_received_records_total", func(r *Row, x float64) { r.In += x })
		rate("tapflow_stage_sent_records_total", func(r *Row, x float64) { r.Out += x })
		rate("tapflow_stage_discarded_records_total", func(r *Row, x float64) { r.Drop += x })
		rate("tapflow_stage_errors_total", func(r *Row, x float64) { r.ErrRate += x })
		for _, m := range metrics(s, "tapflow_stage_errors_total") {
			row(m).Errors += value(m)
		}
		for _, m := range metrics(s, "tapflow_edge_queue_batches") {
			row(m).Queue += value(m)
		}
		for _, m := range metrics(s, "tapflow_stage_oldest_pending_seconds") {
			row(m).Lag = value(m)
		}
		// The source stage has no stage series of its own: its output is
		// the records it generated or captured.
		for _, src := range []struct{ name, stage string }{
			{"tapflow_synthetic_records_total", "source (synthetic)"},
			{"tapflow_capture_records_total", "source (ebpf)"},
		} {
			ms := metrics(s, src.name)
			if len(ms) == 0 {
				continue
			}
			r := &Row{StageKey: StageKey{Endpoint: s.Endpoint, Pipeline: "agent", Stage: src.stage}, Lag: math.NaN()}
			if p != nil && dt > 0 {
				var d float64
				for _, m := range ms {
					x := value(m) - find(p, src.name, m)
					if x < 0 {
						x = value(m)
					}
					d += x
				}
				r.Out = d / dt
			}
			rows[r.StageKey] = r
		}
		for _, r := range rows {
			v.Rows = append(v.Rows, *r)
		}
		v.Extras = append(v.Extras, extras(s)...)
	}
	slices.SortFunc(v.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Pipeline, b.Pipeline), cmp.Compare(order(a.Stage), order(b.Stage)), cmp.Compare(a.Stage, b.Stage))
	})
	return v
}

// order puts the stages of a pipeline in flow order.
func order(stage string) int {
	for i, s := range []string{"source", "synthetic", "ebpf", "ebpf-meters", "consume", "enrich", "publish", "parquet"} {
		if strings.HasPrefix(stage, s) {
			return i
		}
	}
	return 99
}

// extras are the endpoint-wide figures: what waits where, and what was
// lost.
func extras(s *Sample) []Extra {
	var out []Extra
	add := func(name, format string, sum func() (float64, bool)) {
		if x, ok := sum(); ok {
			out = append(out, Extra{Endpoint: s.Endpoint, Name: name, Value: fmt.Sprintf(format, x)})
		}
	}
	total := func(name string) func() (float64, bool) {
		return func() (float64, bool) {
			ms := metrics(s, name)
			var t float64
			for _, m := range ms {
				t += value(m)
			}
			return t, len(ms) > 0
		}
	}
	maxOf := func(name string) func() (float64, bool) {
		return func() (float64, bool) {
			ms := metrics(s, name)
			var t float64
			for _, m := range ms {
				t = max(t, value(m))
			}
			return t, len(ms) > 0
		}
	}
	add("stream backlog (msgs)", "%.0f", total("tapflow_consume_stream_pending_messages"))
	add("consumer pending (msgs)", "%.0f", total("tapflow_consumer_pending_messages"))
	add("spool (bytes)", "%.0f", total("tapflow_spool_bytes"))
	add("spool oldest (s)", "%.1f", maxOf("tapflow_spool_oldest_age_seconds"))
	add("spool dropped (records)", "%.0f", total("tapflow_spool_dropped_records_total"))
	add("capture attached", "%.0f", total("tapflow_capture_attached_interfaces"))
	add("publish refused", "%.0f", total("tapflow_publish_refused_total"))
	add("parquet open files", "%.0f", total("tapflow_parquet_open_files"))
	add("inventory age (s)", "%.0f", maxOf("tapflow_inventory_age_seconds"))
	return out
}

func metrics(s *Sample, name string) []*dto.Metric {
	if mf := s.Families[name]; mf != nil {
		return mf.GetMetric()
	}
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// find returns the value in p of the series of name with m's labels.
func find(p *Sample, name string, m *dto.Metric) float64 {
	for _, o := range metrics(p, name) {
		if sameLabels(o, m) {
			return value(o)
		}
	}
	return 0
}

func sameLabels(a, b *dto.Metric) bool {
	if len(a.GetLabel()) != len(b.GetLabel()) {
		return false
	}
	for i, l := range a.GetLabel() {
		o := b.GetLabel()[i]
		if l.GetName() != o.GetName() || l.GetValue() != o.GetValue() {
			return false
		}
	}
	return true
}
