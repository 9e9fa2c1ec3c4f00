package parquet

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	pqa "github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/schemas/columns"
)

// BenchmarkColumnWriter compares the two ways to write decoded Arrow
// columns to Parquet, writer alone (messages decoded before the timer,
// 1M rows in messages of 16384, one file, zstd fastest, dictionary on the
// dict columns of the column table, delta on times where the library has
// it): parquet-go's column writers (the sink's columnWriter) and arrow-go's
// pqarrow FileWriter.WriteBuffered. Reported: records/cpu-s, B/record.
func BenchmarkColumnWriter(b *testing.B) {
	recs := benchFlows()
	enc, err := schemas.NewEncoder(schemas.CodecNone)
	if err != nil {
		b.Fatal(err)
	}
	// pqarrow writes one schema per file, and messages' dictionary index
	// types vary with their dictionaries: it reads the int32 form, the
	// declared schema (schemas.ArrowSchema).
	var bodies, wideBodies [][]byte
	wide := enc.WideIndices()
	for i := 0; i < len(recs); i += 16384 {
		body, err := enc.Encode(nil, recs[i:min(i+16384, len(recs))])
		if err != nil {
			b.Fatal(err)
		}
		bodies = append(bodies, body)
		if body, err = wide.Encode(nil, recs[i:min(i+16384, len(recs))]); err != nil {
			b.Fatal(err)
		}
		wideBodies = append(wideBodies, body)
	}
	b.Run("parquet-go", func(b *testing.B) {
		dec := schemas.NewDecoderFor(schemas.FlowRows)
		var chunks [][]schemas.Row
		for _, body := range bodies {
			rows, err := dec.Decode(nil, body)
			if err != nil {
				b.Fatal(err)
			}
			chunks = append(chunks, rows)
		}
		cfg := DefaultConfig()
		cfg.Output = b.TempDir()
		s, err := NewFor(cfg, FlowRowSchema, Options{Node: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		opts := s.wopts // the sink's own writer options
		benchWriter(b, func(f *os.File) error {
			w := newColumnWriter(f, schemas.FlowRows, opts)
			n := 0
			for _, rows := range chunks {
				if _, err := w.Write(rows); err != nil {
					return err
				}
				if n += len(rows); n >= cfg.RowGroupRows {
					if err := w.Flush(); err != nil {
						return err
					}
					n = 0
				}
			}
			return w.Close()
		}, len(recs))
	})
	b.Run("pqarrow", func(b *testing.B) {
		var batches []arrow.RecordBatch
		for _, body := range wideBodies {
			r, err := ipc.NewReader(bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			for r.Next() {
				rec := r.RecordBatch()
				rec.Retain()
				batches = append(batches, rec)
			}
			r.Release()
		}
		props := []pqa.WriterProperty{pqa.WithCompression(compress.Codecs.Zstd), pqa.WithCompressionLevel(1),
			pqa.WithDictionaryDefault(false), pqa.WithStats(false), pqa.WithMaxRowGroupLength(int64(DefaultConfig().RowGroupRows))}
		for _, c := range columns.FlowV1 {
			if c.Dict {
				props = append(props, pqa.WithDictionaryFor(c.Name, true))
			}
		}
		benchWriter(b, func(f *os.File) error {
			w, err := pqarrow.NewFileWriter(schemas.ArrowSchema(), f, pqa.NewWriterProperties(props...), pqarrow.DefaultWriterProps())
			if err != nil {
				return err
			}
			for _, rec := range batches {
				if err := w.WriteBuffered(rec); err != nil {
					return err
				}
			}
			return w.Close()
		}, len(recs))
	})
}

func benchWriter(b *testing.B, write func(*os.File) error, rows int) {
	var cpu int64
	var size int64
	for b.Loop() {
		b.StopTimer()
		p := filepath.Join(b.TempDir(), "f.parquet")
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		c0 := cpuTime()
		b.StartTimer()
		if err := write(f); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += int64(cpuTime() - c0)
		_ = f.Close() // pqarrow closes it too
		st, err := os.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		size = st.Size()
		b.StartTimer()
	}
	b.ReportMetric(float64(rows*b.N)/(float64(cpu)/1e9), "records/cpu-s")
	b.ReportMetric(float64(size)/float64(rows), "B/record")
}
