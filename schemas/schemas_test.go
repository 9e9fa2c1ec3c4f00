package schemas

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
	"github.com/parquet-go/parquet-go/format"

	"github.com/tapflow/tapflow/schemas/columns"
	"github.com/tapflow/tapflow/schemas/internal/gen"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden %s: %v (run go test ./schemas -update)", path, err)
	}
	if got != string(want) {
		t.Errorf("%s changed; if intended run go test ./schemas -update\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestGeneratedCodeIsCurrent(t *testing.T) {
	for _, tb := range columns.Tables {
		t.Run(tb.Name, func(t *testing.T) {
			want, err := gen.Render(tb)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(tb.File)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s is stale: run make generate", tb.File)
			}
		})
	}
	t.Run("docs/schema.md", func(t *testing.T) {
		want, err := gen.RenderDoc(columns.Tables)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(gen.DocFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("docs/schema.md is stale (the column table changed): run make generate")
		}
	})
}

// tableCase is what the schema tests need of one record type.
type tableCase struct {
	name    string
	cols    []columns.Column
	typ     reflect.Type
	arrow   func() string
	parquet func() *parquet.Schema
}

var tableCases = []tableCase{
	{columns.SchemaName, columns.FlowV1, reflect.TypeFor[Flow](), func() string { return ArrowSchema().String() }, ParquetSchema},
	{columns.MeterSchemaName, columns.MeterV1, reflect.TypeFor[Meter](), func() string { return MeterTable.ArrowSchema().String() }, MeterTable.ParquetSchema},
}

func TestEveryTableTested(t *testing.T) {
	if len(tableCases) != len(columns.Tables) {
		t.Fatalf("%d tables, %d covered by tableCases", len(columns.Tables), len(tableCases))
	}
	for i, tb := range columns.Tables {
		if tableCases[i].name != tb.Name {
			t.Errorf("tableCases[%d] is %s, want %s", i, tableCases[i].name, tb.Name)
		}
	}
}

func TestStructMatchesColumnTable(t *testing.T) {
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.typ.NumField()
			// a working block after the columns (Flow.Bin) is no column:
			// Parquet and JSON must skip it
			for n > 0 && tc.typ.Field(n-1).Tag.Get("parquet") == "-" {
				if f := tc.typ.Field(n - 1); f.Tag.Get("json") != "-" {
					t.Errorf("%s.%s: parquet:\"-\" without json:\"-\"", tc.typ, f.Name)
				}
				n--
			}
			if n != len(tc.cols) {
				t.Fatalf("%s has %d column fields, table %d columns", tc.typ, n, len(tc.cols))
			}
			for i, c := range tc.cols {
				if f := tc.typ.Field(i); f.Name != c.GoName {
					t.Errorf("field %d: %s, want %s", i, f.Name, c.GoName)
				}
			}
		})
	}
}

func TestArrowSchemaGolden(t *testing.T) {
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) { golden(t, tc.name+".arrow.golden", tc.arrow()+"\n") })
	}
}

func TestParquetSchemaGolden(t *testing.T) {
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) { golden(t, tc.name+".parquet.golden", tc.parquet().String()+"\n") })
	}
}

// TestParquetColumnsFollowTable checks names, order and physical/logical
// types against DESIGN §4 rather than against a golden copy of ourselves.
func TestParquetColumnsFollowTable(t *testing.T) {
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) { checkParquetColumns(t, tc.parquet(), tc.cols) })
	}
}

func checkParquetColumns(t *testing.T, sc *parquet.Schema, cols []columns.Column) {
	fields := sc.Fields()
	if len(fields) != len(cols) {
		t.Fatalf("parquet has %d columns, table %d", len(fields), len(cols))
	}
	for i, c := range cols {
		f := fields[i]
		if f.Name() != c.Name {
			t.Errorf("column %d: %s, want %s", i, f.Name(), c.Name)
		}
		if f.Optional() || f.Repeated() {
			t.Errorf("column %s must be required", c.Name)
		}
		kind := f.Type().Kind()
		lt := f.Type().LogicalType()
		switch c.Kind {
		case columns.Timestamp:
			ts, ok := logical(lt).(*format.TimestampType)
			if kind != parquet.Int64 || !ok || !ts.IsAdjustedToUTC || ts.Unit.String() != "MICROS" {
				t.Errorf("column %s: %v %v, want INT64 TIMESTAMP(MICROS, UTC)", c.Name, kind, lt)
			}
		case columns.Int64:
			if kind != parquet.Int64 {
				t.Errorf("column %s: %v, want INT64", c.Name, kind)
			}
		case columns.Int32:
			if kind != parquet.Int32 {
				t.Errorf("column %s: %v, want INT32", c.Name, kind)
			}
		case columns.String:
			if _, ok := logical(lt).(*format.StringType); kind != parquet.ByteArray || !ok {
				t.Errorf("column %s: %v %v, want BYTE_ARRAY STRING", c.Name, kind, lt)
			}
			if enc := f.Encoding(); c.Dict != (enc != nil && enc.Encoding() == parquet.RLEDictionary.Encoding()) {
				t.Errorf("column %s: dictionary=%v, table says %v", c.Name, enc, c.Dict)
			}
		}
	}
}

func logical(lt *format.LogicalType) any {
	if lt == nil {
		return nil
	}
	return lt.Value
}

func sample(n int) []Flow {
	recs := make([]Flow, n)
	for i := range recs {
		recs[i] = Flow{
			TimeStart: 1_700_000_000_000_000 + int64(i), TimeEnd: 1_700_000_001_000_000 + int64(i),
			Node: "cmp-1", Ifname: fmt.Sprintf("tap%04d", i%7), Direction: []string{"tx", "rx"}[i%2],
			VMMAC: "fa:16:3e:00:00:01", PeerMAC: "fa:16:3e:00:00:02", VLANID: int32(i % 3), IPVersion: 4, Protocol: 6,
			SrcIP: "10.0.0.1", DstIP: fmt.Sprintf("10.0.1.%d", i%250), SrcPort: 40000 + int32(i%1000), DstPort: 443, TCPFlags: 0x18,
			Packets: int64(i + 1), Bytes: int64(64 * (i + 1)), EndReason: "active_timeout",
			TenantID: "t-" + fmt.Sprint(i%5), ServerID: "s", PortID: "p", Zone: "same_tenant", PeerTenantID: "",
			ExternalNetwork: "none", LBID: "", LBSegment: int32(i % 3), AgentID: "agent-a", BatchSeq: 7, RecordIndex: int32(i), MetadataVersion: 3,
		}
	}
	return recs
}

func TestWireRoundTrip(t *testing.T) {
	for _, codec := range Codecs {
		for _, n := range []int{0, 1, 1000} {
			t.Run(fmt.Sprintf("%s/%d", codec, n), func(t *testing.T) {
				enc, err := NewEncoder(codec)
				if err != nil {
					t.Fatal(err)
				}
				want := sample(n)
				body, err := enc.Encode(nil, want)
				if err != nil {
					t.Fatal(err)
				}
				got, err := NewDecoder().Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != n || (n > 0 && !reflect.DeepEqual(got, want)) {
					t.Fatalf("round trip differs: got %d records, want %d", len(got), n)
				}
			})
		}
	}
}

func TestDecodeCorrupt(t *testing.T) {
	enc, _ := NewEncoder(CodecZstd)
	body, err := enc.Encode(nil, sample(100))
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(body)
	for i := len(flipped) / 2; i < len(flipped)/2+64; i++ {
		flipped[i] ^= 0xff
	}
	cases := map[string][]byte{
		"empty":     {},
		"garbage":   []byte("hello, this is not arrow"),
		"truncated": body[:len(body)/2],
		"flipped":   flipped,
		"json":      []byte(`{"time_start":1}`),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := NewDecoder().Decode(nil, b)
			if name == "empty" && err == nil && len(got) == 0 {
				t.Fatal("empty body accepted as a valid batch")
			}
			if err == nil {
				t.Fatalf("decoded %d records from corrupt input", len(got))
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
		})
	}
}

func TestParquetRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := parquet.NewGenericWriter[Flow](&buf, parquet.Compression(&zstd.Codec{Level: zstd.SpeedFastest}),
		parquet.KeyValueMetadata(MetadataKey, SchemaName))
	want := sample(500)
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := f.Lookup(MetadataKey); v != SchemaName {
		t.Errorf("key-value metadata %s=%q, want %q", MetadataKey, v, SchemaName)
	}
	for _, rg := range f.Metadata().RowGroups {
		for _, cc := range rg.Columns {
			if codec := cc.MetaData.Codec; codec != format.Zstd {
				t.Errorf("column %v compressed with %v, want ZSTD", cc.MetaData.PathInSchema, codec)
			}
		}
	}
	got, err := parquet.Read[Flow](bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("parquet round trip differs")
	}
}

func FuzzDecode(f *testing.F) {
	enc, _ := NewEncoder(CodecNone)
	body, _ := enc.Encode(nil, sample(3))
	f.Add(body)
	f.Add([]byte("ARROW1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = NewDecoder().Decode(nil, b) // must not panic
	})
}

func BenchmarkEncode(b *testing.B) {
	recs := sample(16384)
	for _, codec := range []string{CodecNone, CodecLZ4, CodecZstd} {
		b.Run(codec, func(b *testing.B) {
			enc, _ := NewEncoder(codec)
			var body []byte
			for b.Loop() {
				body, _ = enc.Encode(body[:0], recs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
			b.ReportMetric(float64(len(body))/float64(len(recs)), "B/record")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	recs := sample(16384)
	for _, codec := range []string{CodecNone, CodecLZ4, CodecZstd} {
		b.Run(codec, func(b *testing.B) {
			enc, _ := NewEncoder(codec)
			body, _ := enc.Encode(nil, recs)
			dec := NewDecoder()
			var out []Flow
			for b.Loop() {
				out, _ = dec.Decode(out[:0], body)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
		})
	}
}

func sampleMeters(n int) []Meter {
	recs := make([]Meter, n)
	for i := range recs {
		recs[i] = Meter{
			TimeStart: 1_700_000_000_000_000 + int64(i)*10_000_000, TimeEnd: 1_700_000_010_000_000 + int64(i)*10_000_000,
			Node: "cmp-1", Ifname: fmt.Sprintf("tap%04d", i%7), Direction: []string{"tx", "rx"}[i%2],
			Packets: int64(i + 1), Bytes: int64(1500 * (i + 1)), LostPackets: int64(i % 2), LostBytes: int64(100 * (i % 2)),
			FailedUpdates: int64(i % 3), SkippedNonIP: int64(i % 5), AgentID: "agent-a", BatchSeq: 9, RecordIndex: int32(i),
		}
	}
	return recs
}

func TestMeterWireRoundTrip(t *testing.T) {
	for _, codec := range []string{CodecZstd, CodecLZ4, CodecNone} {
		for _, n := range []int{0, 1, 300} {
			t.Run(fmt.Sprintf("%s/%d", codec, n), func(t *testing.T) {
				enc, err := NewEncoderFor(MeterTable, codec)
				if err != nil {
					t.Fatal(err)
				}
				want := sampleMeters(n)
				body, err := enc.Encode(nil, want)
				if err != nil {
					t.Fatal(err)
				}
				got, err := NewDecoderFor(MeterTable).Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != n || (n > 0 && !reflect.DeepEqual(got, want)) {
					t.Fatalf("round trip differs: got %d records, want %d", len(got), n)
				}
			})
		}
	}
}

// TestDecodeWrongSchema: a message of one schema on the other's consumer
// is corrupt (dead-lettered), never misread.
func TestDecodeWrongSchema(t *testing.T) {
	fenc, _ := NewEncoder(CodecZstd)
	flows, err := fenc.Encode(nil, sample(3))
	if err != nil {
		t.Fatal(err)
	}
	menc, _ := NewEncoderFor(MeterTable, CodecZstd)
	meters, err := menc.Encode(nil, sampleMeters(3))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		decode func() (int, error)
		want   string
	}{
		{"meters as flows", func() (int, error) { r, err := NewDecoder().Decode(nil, meters); return len(r), err }, `schema "meter.v1", want "flow.v1"`},
		{"flows as meters", func() (int, error) { r, err := NewDecoderFor(MeterTable).Decode(nil, flows); return len(r), err }, `schema "flow.v1", want "meter.v1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := tc.decode()
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decoded %d records, err %v; want ErrCorrupt with %q", n, err, tc.want)
			}
		})
	}
}

func TestMeterParquetRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := parquet.NewGenericWriter[Meter](&buf, parquet.KeyValueMetadata(MetadataKey, MeterSchemaName))
	want := sampleMeters(100)
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := parquet.Read[Meter](bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("parquet round trip differs")
	}
}
