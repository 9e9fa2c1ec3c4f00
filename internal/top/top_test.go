package top

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

const scrape1 = `# TYPE tapflow_stage_received_records_total counter
tapflow_stage_received_records_total{pipeline="agent",stage="enrich"} 1000
tapflow_stage_sent_records_total{pipeline="agent",stage="enrich"} 900
tapflow_stage_discarded_records_total{pipeline="agent",stage="enrich",reason="a"} 10
tapflow_stage_discarded_records_total{pipeline="agent",stage="enrich",reason="b"} 0
tapflow_stage_errors_total{pipeline="collector",stage="parquet"} 5
tapflow_edge_queue_batches{pipeline="agent",stage="publish"} 3
tapflow_stage_oldest_pending_seconds{pipeline="collector",stage="parquet"} 1.5
tapflow_synthetic_records_total 1000
tapflow_consume_stream_pending_messages{stream="TAPFLOW_FLOWS"} 7
tapflow_consume_stream_pending_messages{stream="TAPFLOW_METERS"} 1
`

const scrape2 = `tapflow_stage_received_records_total{pipeline="agent",stage="enrich"} 3000
tapflow_stage_sent_records_total{pipeline="agent",stage="enrich"} 2900
tapflow_stage_discarded_records_total{pipeline="agent",stage="enrich",reason="a"} 20
tapflow_stage_discarded_records_total{pipeline="agent",stage="enrich",reason="b"} 10
tapflow_stage_errors_total{pipeline="collector",stage="parquet"} 2
tapflow_edge_queue_batches{pipeline="agent",stage="publish"} 4
tapflow_stage_oldest_pending_seconds{pipeline="collector",stage="parquet"} 0.5
tapflow_synthetic_records_total 3000
tapflow_consume_stream_pending_messages{stream="TAPFLOW_FLOWS"} 9
`

func sample(t *testing.T, text string, at time.Time) *Sample {
	t.Helper()
	mfs, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return &Sample{Endpoint: "http://a:9464/metrics", At: at, Families: mfs}
}

// TestCompute: rates are the increase over the time between scrapes
// (summed over labels other than pipeline and stage), a counter that went
// down (a restart) counts from zero, gauges are the latest value, a failed
// endpoint is listed and the first view has zero rates.
func TestCompute(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	a, b := sample(t, scrape1, t0), sample(t, scrape2, t0.Add(2*time.Second))
	down := &Sample{Endpoint: "http://b:9464/metrics", Err: errors.New("connection refused")}
	v := Compute([]*Sample{a}, []*Sample{b, down})
	get := func(pipeline, stage string) Row {
		for _, r := range v.Rows {
			if r.Pipeline == pipeline && r.Stage == stage {
				return r
			}
		}
		t.Fatalf("no row %s/%s in %+v", pipeline, stage, v.Rows)
		return Row{}
	}
	tests := []struct {
		name      string
		got, want float64
	}{
		{"enrich in/s", get("agent", "enrich").In, 1000},
		{"enrich out/s", get("agent", "enrich").Out, 1000},
		{"enrich drop/s (two reasons)", get("agent", "enrich").Drop, 10},
		{"parquet errors after a restart", get("collector", "parquet").Errors, 2},
		{"parquet err/s after a restart", get("collector", "parquet").ErrRate, 1},
		{"parquet lag", get("collector", "parquet").Lag, 0.5},
		{"publish queue", get("agent", "publish").Queue, 4},
		{"source out/s", get("agent", "source (synthetic)").Out, 1000},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if !math.IsNaN(get("agent", "enrich").Lag) {
		t.Error("enrich has no lag gauge; want NaN (shown as -)")
	}
	if len(v.Errors) != 1 || !strings.Contains(v.Errors[0], "connection refused") {
		t.Errorf("errors %v", v.Errors)
	}
	var sb strings.Builder
	if err := Render(&sb, v); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"stream backlog (msgs) 9", "DOWN http://b:9464/metrics: connection refused", "source (synthetic)"} {
		if !strings.Contains(sb.String(), w) {
			t.Errorf("screen lacks %q:\n%s", w, sb.String())
		}
	}
	first := Compute(nil, []*Sample{a})
	for _, r := range first.Rows {
		if r.In != 0 || r.Out != 0 {
			t.Errorf("first view has a rate: %+v", r)
		}
	}
}
