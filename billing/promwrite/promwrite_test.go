package promwrite_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/internal/testkit/promserver"
	"github.com/tapflow/tapflow/internal/units"
)

// TestWriteToPrometheus writes to Debian's real Prometheus (2.42, remote
// write receiver, out-of-order window) samples inside an hour 3 h in the
// past, as billing/usage does, and reads them back with the query
// CloudKitty asks: sum_over_time(m[3600s]) at the hour's end holds every
// sample inside the hour, a sample at the hour's start of the next hour's
// range does not leak, identical samples sent again change nothing.
func TestWriteToPrometheus(t *testing.T) {
	prom := promserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := promwrite.New(promwrite.Config{URL: prom.WriteURL(), Timeout: units.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	end := h.Add(time.Hour).UnixMilli()
	lbl := func(p string) []promwrite.Label {
		return []promwrite.Label{{Name: "project_id", Value: p}, {Name: "zone", Value: "external"}}
	}
	const big = 1<<53 - 1 // the largest integer a float64 holds exactly
	steps := []struct {
		name   string
		series []promwrite.Series
		want   map[string]float64 // project → sum_over_time at the hour's end
	}{
		{"revision 0", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 123456789, TimestampMs: end - 1}),
			promwrite.NewSeries("test_billed_bytes", lbl("b"), promwrite.Sample{Value: big - 5, TimestampMs: end - 1}),
			// the previous hour's sample, at its own end − 1 ms: outside
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 7, TimestampMs: h.UnixMilli() - 1}),
		}, map[string]float64{"a": 123456789, "b": big - 5}},
		{"correction", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: -1000, TimestampMs: end - 2}),
			promwrite.NewSeries("test_billed_bytes", lbl("b"), promwrite.Sample{Value: 5, TimestampMs: end - 2}),
		}, map[string]float64{"a": 123455789, "b": big}},
		{"both again", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 123456789, TimestampMs: end - 1}, promwrite.Sample{Value: -1000, TimestampMs: end - 2}),
		}, map[string]float64{"a": 123455789, "b": big}},
	}
	for _, st := range steps {
		if err := c.Write(ctx, st.series); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, err := prom.Query(ctx, `sum(sum_over_time(test_billed_bytes[3600s])) by (project_id)`, h.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for _, s := range got {
			m[s.Metric["project_id"]] = s.Value
		}
		for p, w := range st.want {
			if m[p] != w {
				t.Errorf("%s: project %s: sum_over_time %.0f, want %.0f (all: %v)", st.name, p, m[p], w, m)
			}
		}
	}
}

// TestWriteErrors: a receiver that is not there is retryable; a refusal
// (no remote-write receiver: 404) is not, and says how to enable it.
func TestWriteErrors(t *testing.T) {
	prom := promserver.Start(t)
	ctx := context.Background()
	s := []promwrite.Series{promwrite.NewSeries("x", nil, promwrite.Sample{Value: 1, TimestampMs: time.Now().UnixMilli()})}
	for _, tc := range []struct {
		name, url string
		retry     bool
		want      string
	}{
		{"wrong path", prom.URL + "/api/v1/writ", false, "--web.enable-remote-write-receiver"},
		{"nobody listening", "http://127.0.0.1:1/api/v1/write", true, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := promwrite.New(promwrite.Config{URL: tc.url, Timeout: units.Duration(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Write(ctx, s)
			if err == nil || promwrite.IsRetryable(err) != tc.retry || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v (retryable %v), want one containing %q, retryable %v", err, promwrite.IsRetryable(err), tc.want, tc.retry)
			}
		})
	}
}
