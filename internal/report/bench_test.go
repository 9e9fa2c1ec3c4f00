package report

import (
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
)

// BenchmarkRead reads 1M records (3 partitions) written by the sink, per
// tenant × zone × direction (the default report).
func BenchmarkRead(b *testing.B) {
	benchRead(b, Options{}, 1_000_000)
}

// BenchmarkReadBy groups by more and wider dimensions, with a time range
// that cuts through a partition (so time_end is read and filtered).
func BenchmarkReadBy(b *testing.B) {
	start := time.Date(2026, 11, 29, 10, 40, 0, 0, time.UTC)
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"demo", Options{By: []string{"tenant", "zone", "direction", "external_network"}}},
		{"port", Options{By: []string{"port"}}},
		{"all-dims", Options{By: []string{"tenant", "zone", "direction", "external_network", "server", "port", "lb", "lb_segment", "node", "ifname"}}},
		{"tenant-range", Options{By: []string{"tenant"}, From: start.Add(10 * time.Minute), To: start.Add(100 * time.Minute)}},
	} {
		b.Run(bc.name, func(b *testing.B) { benchRead(b, bc.opts, -1) })
	}
}

func benchRead(b *testing.B, opts Options, want int64) {
	recs := parquettest.Flows(parquettest.Spec{Records: 1_000_000, Span: 2 * time.Hour})
	dir := writeWithSinkB(b, recs)
	for b.Loop() {
		rep, err := Read(dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		if want >= 0 && rep.Total.Records != want {
			b.Fatalf("%d records", rep.Total.Records)
		}
	}
	b.ReportMetric(float64(len(recs)*b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(len(recs)*b.N), "ns/row")
}
