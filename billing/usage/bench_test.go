package usage_test

import (
	"context"
	"testing"
	"time"

	"github.com/klauspost/compress/snappy"

	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/audit"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/report"
	"github.com/tapflow/tapflow/internal/testkit/billingdata"
)

// encoder encodes and compresses what a remote write would send, and
// drops it (the benchmark measures tapflow, not the receiver).
type encoder struct{ bytes int }

func (e *encoder) Write(_ context.Context, s []promwrite.Series) error {
	e.bytes = len(snappy.Encode(nil, promwrite.Encode(s)))
	return nil
}

// BenchmarkPublishHour: publishing one closed hour (list, audit, exact
// totals, state, encoding) against its two baselines in the same run:
// `tapflow report` of that hour by the billing key (report.ReadOutput) and
// `tapflow audit` of that hour (audit.Run, which also reads the hours on
// either side for the records crossing its edges). publish ÷ (report +
// audit) is what the bookkeeping costs; publish ÷ report what the audit
// gate costs. 32 taps in both directions, 21 581 flow records in the
// hour (and 7 680 meter records: a tick every 30 s).
func BenchmarkPublishHour(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	h := time.Date(2026, 12, 4, 5, 0, 0, 0, time.UTC)
	d := billingdata.Generate(billingdata.Spec{Start: h.Add(-5 * time.Minute), Span: time.Hour + 10*time.Minute, Nodes: 16})
	if err := billingdata.Write(ctx, dir, d, nil); err != nil {
		b.Fatal(err)
	}
	out, err := dataset.Open(ctx, dir, dataset.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("report_baseline", func(b *testing.B) {
		var records int64
		for b.Loop() {
			rep, err := report.ReadOutput(ctx, out, report.Options{By: usage.Dimensions, From: h, To: h.Add(time.Hour)})
			if err != nil {
				b.Fatal(err)
			}
			records = rep.Total.Records
		}
		b.ReportMetric(float64(records), "records")
	})
	b.Run("audit_baseline", func(b *testing.B) {
		for b.Loop() {
			if r, err := audit.Run(ctx, out, audit.Options{From: h, To: h.Add(time.Hour)}); err != nil || !r.OK() {
				b.Fatalf("audit: %v", err)
			}
		}
	})
	b.Run("publish", func(b *testing.B) {
		var records int64
		for b.Loop() {
			b.StopTimer()
			p, err := usage.New(usage.Options{Output: out, Writer: &encoder{}, StateDir: b.TempDir(), Lookback: 24 * time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			o, err := p.Hour(ctx, h)
			if err != nil || o.Action != usage.ActPublished {
				b.Fatalf("%+v %v", o.Action, err)
			}
			records = int64(len(o.Totals))
		}
		b.ReportMetric(float64(records), "keys")
	})
}
