package report

import (
	"testing"
	"time"

	"github.com/tapflow/tapflow/sinks/parquet/parquettest"
)

// BenchmarkRead reads 1M records (3 partitions) written by the sink.
func BenchmarkRead(b *testing.B) {
	recs := parquettest.Flows(parquettest.Spec{Records: 1_000_000, Span: 2 * time.Hour})
	dir := writeWithSinkB(b, recs)
	for b.Loop() {
		rep, err := Read(dir, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Total.Records != int64(len(recs)) {
			b.Fatalf("%d records", rep.Total.Records)
		}
	}
	b.ReportMetric(float64(len(recs)*b.N)/b.Elapsed().Seconds(), "records/s")
}
