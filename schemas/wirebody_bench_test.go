package schemas_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/pierrec/lz4/v4"

	"github.com/tapflow/tapflow/schemas"
)

// BenchmarkWireBody splits the agent's wire encode of the realistic batch
// by column and by stage, for the narrow dictionary indices (narrow, the
// default) and the int32 indices of agents before them (wide), in the
// same iterations so both see the same load.
//
// Per column (bytes sub-benchmark): <column>_B/record in the plain Arrow
// body (its buffers, dictionary included) and <column>_lz4_B/record
// after Arrow's LZ4_FRAME buffer compression (each buffer an LZ4 frame
// with 64 KB blocks and an 8-byte length, as arrow-go writes it).
//
// Per stage (cpu sub-benchmark, CPU ns/record of the process): build
// (records to Arrow arrays), then writing the IPC stream with each codec
// (none, lz4, arrow-zstd; zstd is none plus one zstd frame), and the
// message's B/record per codec.
func BenchmarkWireBody(b *testing.B) {
	recs := realistic(b)
	forms := []struct {
		name    string
		toArrow func([]schemas.Flow) arrow.RecordBatch
	}{{"narrow", schemas.ToArrow}, {"wide", schemas.ToArrowWide}}
	b.Run("bytes", func(b *testing.B) {
		cols := schemas.FlowTable.Columns()
		lw := lz4.NewWriter(nil)
		var out bytes.Buffer
		lz4Len := func(p []byte) int {
			if len(p) == 0 {
				return 0
			}
			out.Reset()
			lw.Reset(&out)
			_ = lw.Apply(lz4.ChecksumOption(false), lz4.BlockSizeOption(lz4.Block64Kb))
			_, _ = lw.Write(p)
			_ = lw.Close()
			return 8 + out.Len()
		}
		for b.Loop() {
			for _, f := range forms {
				rec := f.toArrow(recs)
				var plain, packed int
				for k, c := range rec.Columns() {
					var p, z int
					for _, buf := range columnBuffers(c.Data()) {
						p += len(buf)
						z += lz4Len(buf)
					}
					plain, packed = plain+p, packed+z
					per := func(n int) float64 { return float64(n) / float64(len(recs)) }
					b.ReportMetric(per(p), f.name+"_"+cols[k].Name+"_B/record")
					b.ReportMetric(per(z), f.name+"_"+cols[k].Name+"_lz4_B/record")
				}
				b.ReportMetric(float64(plain)/float64(len(recs)), f.name+"_columns_B/record")
				b.ReportMetric(float64(packed)/float64(len(recs)), f.name+"_columns_lz4_B/record")
				rec.Release()
			}
		}
		b.ReportMetric(0, "ns/op")
	})
	b.Run("cpu", func(b *testing.B) {
		codecs := []struct {
			name string
			opts []ipc.Option
		}{{schemas.CodecNone, nil}, {schemas.CodecLZ4, []ipc.Option{ipc.WithLZ4()}}, {schemas.CodecArrowZstd, []ipc.Option{ipc.WithZstd()}}}
		type tally struct {
			build time.Duration
			write []time.Duration
			size  []int
		}
		t := make([]tally, len(forms))
		for i := range t {
			t[i].write, t[i].size = make([]time.Duration, len(codecs)), make([]int, len(codecs))
		}
		var buf bytes.Buffer
		order := []int{0, 1}
		for b.Loop() {
			// Each form first every other iteration: the GC work one
			// leaves must not land on the other's figures only.
			order[0], order[1] = order[1], order[0]
			for _, i := range order {
				f := forms[i]
				t0 := cpuNow()
				rec := f.toArrow(recs)
				t[i].build += cpuNow() - t0
				for j, c := range codecs {
					buf.Reset()
					t1 := cpuNow()
					w := ipc.NewWriter(&buf, append([]ipc.Option{ipc.WithSchema(rec.Schema())}, c.opts...)...)
					if err := w.Write(rec); err != nil {
						b.Fatal(err)
					}
					if err := w.Close(); err != nil {
						b.Fatal(err)
					}
					t[i].write[j] += cpuNow() - t1
					t[i].size[j] = buf.Len()
				}
				rec.Release()
			}
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*len(recs)) }
		for i, f := range forms {
			b.ReportMetric(per(t[i].build), f.name+"_build_cpu_ns/record")
			for j, c := range codecs {
				b.ReportMetric(per(t[i].write[j]), f.name+"_"+c.name+"_write_cpu_ns/record")
				b.ReportMetric(float64(t[i].size[j])/float64(len(recs)), f.name+"_"+c.name+"_B/record")
			}
		}
		b.ReportMetric(float64(t[0].build)/float64(t[1].build), "narrow_vs_wide_build")
		for j, c := range codecs {
			b.ReportMetric(float64(t[0].build+t[0].write[j])/float64(t[1].build+t[1].write[j]), "narrow_vs_wide_"+c.name+"_cpu")
			b.ReportMetric(float64(t[0].size[j])/float64(t[1].size[j]), "narrow_vs_wide_"+c.name+"_B")
		}
		b.ReportMetric(0, "ns/op")
	})
}

// BenchmarkWireBodyDecode: the collector's decode into rows of the
// realistic batch sent with narrow dictionary indices against int32
// ones, per codec (none, lz4), in the same iterations in alternating
// order; CPU ns/record and narrow_vs_wide_<codec>.
func BenchmarkWireBodyDecode(b *testing.B) {
	recs := realistic(b)
	codecs := []string{schemas.CodecNone, schemas.CodecLZ4}
	var bodies [2][][]byte // [narrow, wide][codec]
	for _, c := range codecs {
		enc, err := schemas.NewEncoder(c)
		if err != nil {
			b.Fatal(err)
		}
		for i, e := range []*schemas.Encoder{enc, enc.WideIndices()} {
			body, err := e.Encode(nil, recs)
			if err != nil {
				b.Fatal(err)
			}
			bodies[i] = append(bodies[i], body)
		}
	}
	dec := schemas.NewDecoderFor(schemas.FlowRows)
	var rows []schemas.Row
	var t [2][2]time.Duration
	order := []int{0, 1}
	for b.Loop() {
		order[0], order[1] = order[1], order[0]
		for _, i := range order {
			for j := range codecs {
				t0 := cpuNow()
				var err error
				if rows, err = dec.Decode(rows[:0], bodies[i][j]); err != nil {
					b.Fatal(err)
				}
				t[i][j] += cpuNow() - t0
			}
		}
	}
	for j, c := range codecs {
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*len(recs)) }
		b.ReportMetric(per(t[0][j]), "narrow_"+c+"_dec_rows_cpu_ns/record")
		b.ReportMetric(per(t[1][j]), "wide_"+c+"_dec_rows_cpu_ns/record")
		b.ReportMetric(float64(t[0][j])/float64(t[1][j]), "narrow_vs_wide_"+c)
	}
	b.ReportMetric(0, "ns/op")
}

// columnBuffers are the data buffers of one column as the IPC body holds
// them: its own, then its dictionary's (no validity bitmaps: no nulls).
func columnBuffers(d arrow.ArrayData) [][]byte {
	var out [][]byte
	for _, buf := range d.Buffers() {
		if buf != nil {
			out = append(out, buf.Bytes())
		}
	}
	if d.DataType().ID() == arrow.DICTIONARY {
		dict := d.Dictionary()
		out = append(out, columnBuffers(dict)...)
	}
	return out
}

// BenchmarkWireColumnForm asks, per string column of the realistic batch,
// whether plain utf8 would beat its wire form: <column>_distinct/rows,
// <column>_dict_lz4_B/record and <column>_plain_lz4_B/record (buffers
// compressed as in BenchmarkWireBody), for every column the narrow form
// sends as a dictionary (src_ip and dst_ip too, when their values repeat:
// ipColumn). The cpu sub-benchmark: building the table in the narrow
// form (dict) or all plain (plain), then its lz4 write, alternating
// order, CPU ns/record.
func BenchmarkWireColumnForm(b *testing.B) {
	recs := realistic(b)
	n := float64(len(recs))
	b.Run("bytes", func(b *testing.B) {
		cols := schemas.FlowTable.Columns()
		lw := lz4.NewWriter(nil)
		var out bytes.Buffer
		lz4Len := func(c arrow.Array) int {
			z := 0
			for _, p := range columnBuffers(c.Data()) {
				out.Reset()
				lw.Reset(&out)
				_ = lw.Apply(lz4.ChecksumOption(false), lz4.BlockSizeOption(lz4.Block64Kb))
				_, _ = lw.Write(p)
				_ = lw.Close()
				z += 8 + out.Len()
			}
			return z
		}
		for b.Loop() {
			dict, plain := schemas.ToArrow(recs), schemas.ToArrowPlain(recs)
			for k, d := range dict.Columns() {
				name := cols[k].Name
				if d.DataType().ID() != arrow.DICTIONARY {
					continue
				}
				b.ReportMetric(float64(d.Data().Dictionary().Len())/n, name+"_distinct/rows")
				b.ReportMetric(float64(lz4Len(d))/n, name+"_dict_lz4_B/record")
				b.ReportMetric(float64(lz4Len(plain.Column(k)))/n, name+"_plain_lz4_B/record")
			}
			dict.Release()
			plain.Release()
		}
		b.ReportMetric(0, "ns/op")
	})
	b.Run("cpu", func(b *testing.B) {
		forms := []func([]schemas.Flow) arrow.RecordBatch{schemas.ToArrow, schemas.ToArrowPlain}
		var build, write [2]time.Duration
		var size [2]int
		var buf bytes.Buffer
		order := []int{0, 1}
		for b.Loop() {
			order[0], order[1] = order[1], order[0]
			for _, i := range order {
				t0 := cpuNow()
				rec := forms[i](recs)
				t1 := cpuNow()
				buf.Reset()
				w := ipc.NewWriter(&buf, ipc.WithSchema(rec.Schema()), ipc.WithLZ4())
				if err := w.Write(rec); err != nil {
					b.Fatal(err)
				}
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
				build[i], write[i] = build[i]+t1-t0, write[i]+cpuNow()-t1
				size[i] = buf.Len()
				rec.Release()
			}
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / n }
		for i, f := range []string{"dict", "plain"} {
			b.ReportMetric(per(build[i]), f+"_build_cpu_ns/record")
			b.ReportMetric(per(write[i]), f+"_lz4_write_cpu_ns/record")
			b.ReportMetric(float64(size[i])/n, f+"_lz4_B/record")
		}
		b.ReportMetric(float64(build[1]+write[1])/float64(build[0]+write[0]), "plain_vs_dict_cpu")
		b.ReportMetric(0, "ns/op")
	})
}
