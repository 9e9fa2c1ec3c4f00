package parquet

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/format"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/schemas/columns"
)

// TestDictIndexLayout: every dictionary column of the collector's files
// takes the index path, and every integer column the slice path, with
// the parquet-go in go.mod. It fails when an upgrade changes the
// unexported layout dictindex.go reads (the files stay right then,
// through the value path, but the collector is slower).
func TestDictIndexLayout(t *testing.T) {
	for _, table := range []*schemas.Table[schemas.Row]{schemas.FlowRows, schemas.MeterRows} {
		var out bytes.Buffer
		w := newColumnWriter(&out, table, nil)
		n := 0
		for p, cw := range w.w.ColumnWriters() {
			col := table.Columns()[w.colOf[p]]
			idx, d := w.ix.slot(cw)
			if got := idx != nil && d != nil; got != col.Dict {
				t.Errorf("%s column %s: index path %v, want %v (Dict)", table.Name(), col.Name, got, col.Dict)
			}
			if _, fast := d.(*boundsDict); col.Dict && !fast {
				t.Errorf("%s column %s: page bounds not once per distinct id (dictbounds.go)", table.Name(), col.Name)
			}
			if col.Dict {
				n++
			}
			var direct bool
			switch buf := w.direct(cw); col.Kind {
			case columns.Timestamp, columns.Int64:
				_, direct = buf.(pq.Int64Writer)
			case columns.Int32:
				_, direct = buf.(pq.Int32Writer)
			default:
				direct = true
			}
			if !direct {
				t.Errorf("%s column %s: no slice path", table.Name(), col.Name)
			}
		}
		if n == 0 {
			t.Errorf("%s: no dictionary column", table.Name())
		}
	}
}

// TestDictIndicesSameFile: the index path writes the same bytes as
// inserting every value, over messages with wire dictionaries and plain
// strings, pieces mixing messages, several pages and row groups, and a
// dictionary outgrowing DictionaryMaxBytes (the writer turns to plain
// pages mid row group); the file reads back as the records.
func TestDictIndicesSameFile(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 30000, Span: time.Hour})
	for i := range recs {
		recs[i].AgentID, recs[i].BatchSeq, recs[i].RecordIndex = "agent-x", int64(i/3000)+1, int32(i%3000)
	}
	dictEnc, err := schemas.NewEncoder(schemas.CodecLZ4)
	if err != nil {
		t.Fatal(err)
	}
	encs := []*schemas.Encoder{dictEnc, dictEnc.PlainStrings()}
	dec := schemas.NewDecoderFor(schemas.FlowRows)
	var chunks [][]schemas.Row
	for i := 0; i < len(recs); i += 3000 {
		body, err := encs[i/3000%3/2].Encode(nil, recs[i:min(i+3000, len(recs))]) // 2 of 3 with dictionaries
		if err != nil {
			t.Fatal(err)
		}
		rows, err := dec.Decode(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, rows)
	}
	// Pieces as the sink makes them, plus some mixing two messages.
	rng := rand.New(rand.NewPCG(1, 2))
	var pieces [][]schemas.Row
	var want []schemas.Flow
	for k, rows := range chunks {
		for len(rows) > 0 {
			n := min(len(rows), 1+rng.IntN(5000))
			piece := rows[:n]
			if k > 0 && n%3 == 0 {
				piece = append(append([]schemas.Row(nil), chunks[k-1][:n/3]...), piece...)
			}
			pieces = append(pieces, piece)
			for _, r := range piece {
				want = append(want, recs[(r.Index())+3000*chunkOf(chunks, r)])
			}
			rows = rows[n:]
		}
	}
	for _, tc := range []struct {
		name    string
		wopts   []pq.WriterOption
		toPlain bool
	}{
		{"default", nil, false},
		{"small pages", []pq.WriterOption{pq.PageBufferSize(4 << 10)}, false},
		{"dictionary to plain", []pq.WriterOption{pq.PageBufferSize(8 << 10), pq.DictionaryMaxBytes(2 << 10)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write := func(valuePath bool) []byte {
				var out bytes.Buffer
				w := newColumnWriter(&out, schemas.FlowRows, tc.wopts)
				w.valuePath = valuePath
				n := 0
				for _, piece := range pieces {
					if _, err := w.Write(piece); err != nil {
						t.Fatal(err)
					}
					if n += len(piece); n >= 7000 {
						if err := w.Flush(); err != nil {
							t.Fatal(err)
						}
						n = 0
					}
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				return out.Bytes()
			}
			got, values := write(false), write(true)
			if !bytes.Equal(got, values) {
				t.Errorf("index path: %d bytes, value path: %d bytes, not the same", len(got), len(values))
			}
			if mixed := mixedEncodings(t, got); mixed != tc.toPlain {
				t.Errorf("dictionary and plain pages in one column chunk: %v, want %v", mixed, tc.toPlain)
			}
			read, err := pq.Read[schemas.Flow](bytes.NewReader(got), int64(len(got)))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(read, want) {
				t.Error("rows read back differ from the rows written")
			}
		})
	}
}

// chunkOf is the position of r's message in chunks.
func chunkOf(chunks [][]schemas.Row, r schemas.Row) int {
	for k, rows := range chunks {
		if rows[0].Chunk() == r.Chunk() {
			return k
		}
	}
	return -1
}

// mixedEncodings tells whether a column chunk of the file has both
// dictionary and plain data pages.
func mixedEncodings(t *testing.T, file []byte) bool {
	t.Helper()
	f, err := pq.OpenFile(bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	for _, rg := range f.Metadata().RowGroups {
		for _, c := range rg.Columns {
			var dict, plain bool
			for _, e := range c.MetaData.EncodingStats {
				if e.PageType == format.DataPage || e.PageType == format.DataPageV2 {
					dict = dict || e.Encoding == format.RLEDictionary
					plain = plain || e.Encoding == format.Plain
				}
			}
			if dict && plain {
				return true
			}
		}
	}
	return false
}
