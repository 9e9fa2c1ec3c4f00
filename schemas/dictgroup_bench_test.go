package schemas_test

import (
	"testing"
	"time"

	"github.com/tapflow/tapflow/schemas"
)

// BenchmarkDictGroups: building the wire columns of the realistic batch
// (codec none, so the figure is the column build and IPC framing) with
// the dictionary groups (dictgroup.go) and with every column adding its
// own values, alternating within each iteration; CPU ns/record.
func BenchmarkDictGroups(b *testing.B) {
	recs := realistic(b)
	enc, err := schemas.NewEncoder(schemas.CodecNone)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { schemas.SetDictGroups(true) })
	var out []byte
	var t [2]time.Duration
	for b.Loop() {
		for _, on := range []bool{true, false} {
			schemas.SetDictGroups(on)
			t0 := cpuNow()
			if out, err = enc.Encode(out[:0], recs); err != nil {
				b.Fatal(err)
			}
			if on {
				t[0] += cpuNow() - t0
			} else {
				t[1] += cpuNow() - t0
			}
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*len(recs)) }
	b.ReportMetric(per(t[0]), "groups_cpu_ns/record")
	b.ReportMetric(per(t[1]), "columns_cpu_ns/record")
	b.ReportMetric(float64(t[0])/float64(t[1]), "groups_vs_columns")
	b.ReportMetric(0, "ns/op")
}
