package schemas

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/tapflow/tapflow/schemas/columns"
)

// Hostile wire messages, rebuilt here from valid ones: the crashers of
// issue 22 and their variants. They are the fuzz targets' seeds
// (fuzz_test.go) and TestHostileWireMessages's cases.

// ipcMsg is one message of an Arrow IPC stream: where its flatbuffer
// metadata and its body sit in the stream, its header type and the
// positions (in the metadata) of its root and header tables.
type ipcMsg struct {
	metaAt, metaLen, bodyAt, bodyLen int
	lenAt                            int // the metadata length field
	hdr                              uint8
	root, header                     int
}

func (m ipcMsg) meta(b []byte) []byte { return b[m.metaAt : m.metaAt+m.metaLen] }

// ipcMessagesOf lists the messages of a valid stream.
func ipcMessagesOf(t testing.TB, b []byte) []ipcMsg {
	t.Helper()
	var out []ipcMsg
	for off := 0; off+8 <= len(b); {
		if binary.LittleEndian.Uint32(b[off:]) != 0xFFFFFFFF {
			t.Fatalf("no continuation marker at byte %d", off)
		}
		n := int(binary.LittleEndian.Uint32(b[off+4:]))
		if n == 0 {
			break
		}
		m := ipcMsg{lenAt: off + 4, metaAt: off + 8, metaLen: n}
		meta := m.meta(b)
		var ok bool
		if m.root, ok = fbRoot(meta); !ok {
			t.Fatalf("bad root at byte %d", off)
		}
		m.hdr, _ = fbUint8(meta, m.root, 1)
		m.header, _ = fbSub(meta, m.root, 2)
		bl, _ := fbInt64(meta, m.root, 3)
		m.bodyAt, m.bodyLen = m.metaAt+n, int(bl)
		out = append(out, m)
		off = m.bodyAt + m.bodyLen
	}
	return out
}

// batchOf is the record batch table of a record or dictionary batch.
func (m ipcMsg) batchOf(t testing.TB, b []byte) int {
	if m.hdr == hdrRecordBatch {
		return m.header
	}
	rb, ok := fbSub(m.meta(b), m.header, 1)
	if !ok {
		t.Fatal("dictionary batch without data")
	}
	return rb
}

// bufferAt is the stream position and length of buffer i of a batch.
func (m ipcMsg) bufferAt(t testing.TB, b []byte, i int) (int, int) {
	t.Helper()
	meta := m.meta(b)
	v, n, ok := fbVector(meta, m.batchOf(t, b), 2, 16)
	if !ok || i >= n {
		t.Fatalf("buffer %d of %d", i, n)
	}
	off := binary.LittleEndian.Uint64(meta[v+16*i:])
	l := binary.LittleEndian.Uint64(meta[v+16*i+8:])
	return m.bodyAt + int(off), int(l)
}

// fieldPos is the position (in the schema message's metadata) of the
// schema's fields vector length, and that of field k's table.
func schemaFields(t testing.TB, b []byte, m ipcMsg, k int) (lenAt, field int) {
	t.Helper()
	meta := m.meta(b)
	v, n, ok := fbVector(meta, m.header, 1, 4)
	if !ok || k >= n {
		t.Fatalf("field %d of %d", k, n)
	}
	f, _ := fbVectorTable(meta, v, k)
	return m.metaAt + v - 4, f
}

// wireFlows are flows with a few distinct values in every string column
// (node too), so every dictionary has several entries.
func wireFlows(n int) []Flow {
	recs := sample(n)
	for i := range recs {
		recs[i].Node = fmt.Sprintf("cmp-%d", i%4)
	}
	return recs
}

func encodeWith(t testing.TB, codec string, plain bool, recs []Flow) []byte {
	t.Helper()
	e, err := NewEncoder(codec)
	if err != nil {
		t.Fatal(err)
	}
	if plain {
		e = e.PlainStrings()
	}
	body, err := e.Encode(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// columnBuffers is the index of the first buffer of column k in a
// record batch of a table's (flat) schema.
func columnBuffers[T any](tb *Table[T], k int, plain bool) int {
	bi := 0
	for _, c := range tb.cols[:k] {
		bi += 2
		if c.Kind == columns.String && (plain || !c.Dict) {
			bi++
		}
	}
	return bi
}

// crasherOffsets is crasher (a): a valid flow message (about 7.7 KB
// plain) whose node value offsets do not increase: offset 1 is set to
// the last one, so arrow-go's only check (the last offset within the
// data) passes. dict: the node dictionary's offsets instead.
func crasherOffsets(t testing.TB, dict bool) []byte {
	b := encodeWith(t, CodecNone, !dict, wireFlows(20))
	msgs := ipcMessagesOf(t, b)
	k := FlowTable.ColumnIndex("node")
	var at, l int
	if dict {
		d := dictMessage(t, b, msgs, k)
		at, l = d.bufferAt(t, b, 1)
	} else {
		at, l = msgs[len(msgs)-1].bufferAt(t, b, columnBuffers(FlowTable, k, true)+1)
	}
	n := l/4 - 1
	last := binary.LittleEndian.Uint32(b[at+4*n:])
	if n < 3 || last <= binary.LittleEndian.Uint32(b[at+8:]) {
		t.Fatalf("node offsets too few to tamper: %d values", n)
	}
	binary.LittleEndian.PutUint32(b[at+4:], last)
	return b
}

// dictMessage is the dictionary batch of field k.
func dictMessage(t testing.TB, b []byte, msgs []ipcMsg, k int) ipcMsg {
	t.Helper()
	_, f := schemaFields(t, b, msgs[0], k)
	d, ok := fbSub(msgs[0].meta(b), f, 4)
	if !ok {
		t.Fatalf("field %d is not dictionary-encoded", k)
	}
	id, _ := fbInt64(msgs[0].meta(b), d, 0)
	for _, m := range msgs {
		if m.hdr == hdrDictBatch {
			if got, _ := fbInt64(m.meta(b), m.header, 0); got == id {
				return m
			}
		}
	}
	t.Fatalf("no dictionary batch for id %d", id)
	return ipcMsg{}
}

// crasherDictIndex: a node index beyond the dictionary.
func crasherDictIndex(t testing.TB) []byte {
	b := encodeWith(t, CodecNone, false, wireFlows(20))
	msgs := ipcMessagesOf(t, b)
	at, _ := msgs[len(msgs)-1].bufferAt(t, b, columnBuffers(FlowTable, FlowTable.ColumnIndex("node"), false)+1)
	b[at+5] = 100 // int8 indices: one node
	return b
}

// crasherDictIndexWide is crasherDictIndex in the int32 indices of
// agents before narrow indices.
func crasherDictIndexWide(t testing.TB) []byte {
	e, err := NewEncoder(CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.WideIndices().Encode(nil, wireFlows(20))
	if err != nil {
		t.Fatal(err)
	}
	msgs := ipcMessagesOf(t, b)
	at, _ := msgs[len(msgs)-1].bufferAt(t, b, columnBuffers(FlowTable, FlowTable.ColumnIndex("node"), false)+1)
	binary.LittleEndian.PutUint32(b[at+4*5:], 1000)
	return b
}

// crasherFields is crasher (b): a valid flow message (about 7.9 KB with
// dictionaries) whose schema declares 2^31 fields; arrow-go would
// allocate 2^31 arrow.Field values (~183 GB) before reading any.
func crasherFields(t testing.TB) []byte {
	b := encodeWith(t, CodecNone, false, wireFlows(20))
	lenAt, _ := schemaFields(t, b, ipcMessagesOf(t, b)[0], 0)
	binary.LittleEndian.PutUint32(b[lenAt:], 1<<31)
	return b
}

// crasherMetaLength is crasher (c): a flow schema message followed by a
// record batch whose metadata length declares 64 MiB − 8 (arrow-go's
// default limit is 64 MiB) that is not there: about 1.6 KB that arrow-go
// answered with a 64 MiB allocation outside the decoder's budget.
func crasherMetaLength(t testing.TB) []byte {
	b := encodeWith(t, CodecNone, true, wireFlows(20))
	msgs := ipcMessagesOf(t, b)
	rb := msgs[len(msgs)-1]
	out := append([]byte(nil), b[:rb.lenAt]...)
	out = binary.LittleEndian.AppendUint32(out, 64<<20-8)
	return append(out, b[rb.metaAt:rb.metaAt+min(rb.metaLen, 64)]...)
}

// crasherBodyLength: the record batch declares a 256 MiB − 64 body
// (arrow-go's default limit is 256 MiB) and ends after its metadata.
func crasherBodyLength(t testing.TB) []byte {
	b := encodeWith(t, CodecNone, true, wireFlows(20))
	msgs := ipcMessagesOf(t, b)
	rb := msgs[len(msgs)-1]
	p, ok := fbField(rb.meta(b), rb.root, 3)
	if !ok {
		t.Fatal("record batch without body length")
	}
	binary.LittleEndian.PutUint64(b[rb.metaAt+p:], 256<<20-64)
	return b[:rb.bodyAt]
}

// crasherUncompressed: an LZ4 message whose packets buffer declares 1 TiB
// uncompressed (arrow-go allocates the declared size, then decompresses).
func crasherUncompressed(t testing.TB) []byte {
	b := encodeWith(t, CodecLZ4, true, wireFlows(20))
	msgs := ipcMessagesOf(t, b)
	at, _ := msgs[len(msgs)-1].bufferAt(t, b, columnBuffers(FlowTable, FlowTable.ColumnIndex("packets"), true)+1)
	binary.LittleEndian.PutUint64(b[at:], 1<<40)
	return b
}

// crasherZstdWindow: an arrow-zstd message whose packets buffer is a zstd
// frame declaring a 512 MiB window (the largest klauspost/compress
// accepts by default; its stream decoder allocates the window).
func crasherZstdWindow(t testing.TB) []byte {
	b := encodeWith(t, CodecArrowZstd, true, wireFlows(20))
	msgs := ipcMessagesOf(t, b)
	at, l := msgs[len(msgs)-1].bufferAt(t, b, columnBuffers(FlowTable, FlowTable.ColumnIndex("packets"), true)+1)
	raw := l - 8 - 9 // magic, descriptor, window, block header
	if raw < 1 {
		t.Fatalf("packets buffer of %d bytes", l)
	}
	f := b[at : at+l]
	binary.LittleEndian.PutUint64(f, uint64(raw))
	binary.LittleEndian.PutUint32(f[8:], 0xFD2FB528)
	f[12] = 0x00                   // no content size, not single segment, no checksum
	f[13] = (29 - 10) << 3         // window 2^29
	h := uint32(raw)<<3 | 0<<1 | 1 // last, raw block
	f[14], f[15], f[16] = byte(h), byte(h>>8), byte(h>>16)
	return b
}

type hostile struct {
	name  string
	build func(testing.TB) []byte
}

var hostileMessages = []hostile{
	{"offsets not monotonic (plain)", func(t testing.TB) []byte { return crasherOffsets(t, false) }},
	{"offsets not monotonic (dictionary)", func(t testing.TB) []byte { return crasherOffsets(t, true) }},
	{"offsets not monotonic (zstd frame)", func(t testing.TB) []byte { return zstdEnc.EncodeAll(crasherOffsets(t, false), nil) }},
	{"dictionary index out of range", crasherDictIndex},
	{"dictionary index out of range (int32 indices)", crasherDictIndexWide},
	{"2^31 schema fields", crasherFields},
	{"64 MiB metadata length", crasherMetaLength},
	{"256 MiB body length", crasherBodyLength},
	{"1 TiB uncompressed buffer (lz4)", crasherUncompressed},
	{"512 MiB zstd window (arrow-zstd)", crasherZstdWindow},
}

// decodeAllForms decodes body with the collector's decoders (rows) and
// the struct decoders of both schemas, reading every row as the
// collector does after Decode returns.
func decodeAllForms(dec *DecoderOf[Row], body []byte) (int, error) {
	rows, err := dec.Decode(nil, body)
	if err != nil {
		return 0, err
	}
	readRows(rows)
	return len(rows), nil
}

// readRows reads every value of every row, as the sink and the
// per-message checks do.
func readRows(rows []Row) (n int) {
	for _, r := range rows {
		c := r.Chunk()
		for k, col := range c.t.cols {
			switch col.Kind {
			case columns.String:
				n += len(r.Bytes(k))
			case columns.Int32:
				n += int(r.Int32(k) & 1)
			default:
				n += int(r.Int64(k) & 1)
			}
		}
		n += len(r.Node()) + len(r.AgentID()) + int(r.BatchSeq()&1) + int(r.RecordIndex()&1) + int(r.TimeEnd()&1)
	}
	return n
}

// TestHostileWireMessages: every crasher of issue 22, and its variants,
// is refused with ErrCorrupt or ErrTooLarge by every wire decoder
// (rows and records, limited as the collector's and unlimited), never a
// panic; and while decoding it the heap grows by less than the budget.
// Without the structure checks (a) panics in the rows' reader, (b) dies
// with fatal error: out of memory and the others allocate 64 MiB to
// 512 MiB: the test fails, or crashes.
func TestHostileWireMessages(t *testing.T) {
	const budget = 4 << 20 // well under what the amplifiers ask for
	small, err := NewDecoderFor(FlowRows).Limited(budget, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	collector, err := NewDecoderFor(FlowRows).Limited(64<<20, 1<<20) // collector defaults
	if err != nil {
		t.Fatal(err)
	}
	records, _ := NewDecoder().Limited(64<<20, 1<<20)
	for _, h := range hostileMessages {
		t.Run(h.name, func(t *testing.T) {
			body := h.build(t)
			for name, decode := range map[string]func() (int, error){
				"rows, 4 MiB":   func() (int, error) { return decodeAllForms(small, body) },
				"rows, 64 MiB":  func() (int, error) { return decodeAllForms(collector, body) },
				"flows, 64 MiB": func() (int, error) { r, err := records.Decode(nil, body); return len(r), err },
				"flows, unlimited": func() (int, error) {
					r, err := NewDecoder().Decode(nil, body)
					return len(r), err
				},
			} {
				n, err := decode()
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
					t.Fatalf("%s: decoded %d records, err %v; want ErrCorrupt or ErrTooLarge", name, n, err)
				}
			}
			for _, d := range []struct {
				dec    *DecoderOf[Row]
				budget uint64
			}{{small, budget}, {collector, 64 << 20}} {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				_, err := d.dec.Decode(nil, body)
				runtime.ReadMemStats(&after)
				total, heap := after.TotalAlloc-before.TotalAlloc, int64(after.HeapAlloc)-int64(before.HeapAlloc)
				t.Logf("%d-byte message: %v; decoding allocated %d bytes (heap %+d) under a %d-byte budget", len(body), err, total, heap, d.budget)
				if total > d.budget {
					t.Errorf("decoding allocated %d bytes, more than the %d-byte budget", total, d.budget)
				}
			}
		})
	}
}

// TestWireLimitsRefused: declared counts beyond the decoder's limits
// that fit in the bytes present.
func TestWireLimitsRefused(t *testing.T) {
	b := encodeWith(t, CodecNone, true, wireFlows(4))
	msgs := ipcMessagesOf(t, b)
	for _, tc := range []struct {
		name string
		edit func([]byte)
		want error
	}{
		{"rows beyond max_batch_records", func(b []byte) {
			rb := msgs[len(msgs)-1]
			p, _ := fbField(rb.meta(b), rb.header, 0)
			binary.LittleEndian.PutUint64(b[rb.metaAt+p:], 1<<20+1)
		}, ErrTooLarge},
		{"negative rows", func(b []byte) {
			rb := msgs[len(msgs)-1]
			p, _ := fbField(rb.meta(b), rb.header, 0)
			binary.LittleEndian.PutUint64(b[rb.metaAt+p:], 1<<63)
		}, ErrCorrupt},
		{"buffer beyond the body", func(b []byte) {
			rb := msgs[len(msgs)-1]
			meta := rb.meta(b)
			v, _, _ := fbVector(meta, rb.header, 2, 16)
			binary.LittleEndian.PutUint64(b[rb.metaAt+v+16*3:], uint64(rb.bodyLen)) // time_end's values
		}, ErrCorrupt},
		{"metadata version V3", func(b []byte) {
			m := msgs[0]
			p, _ := fbField(m.meta(b), m.root, 0)
			binary.LittleEndian.PutUint16(b[m.metaAt+p:], 2)
		}, ErrCorrupt},
		{"more fields than maxWireFields", nil, ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := append([]byte(nil), b...)
			if tc.edit == nil {
				body = manyFields(t, maxWireFields+1)
			} else {
				tc.edit(body)
			}
			d, _ := NewDecoderFor(FlowRows).Limited(64<<20, 1<<20)
			if n, err := decodeAllForms(d, body); !errors.Is(err, tc.want) {
				t.Fatalf("decoded %d rows, err %v; want %v", n, err, tc.want)
			}
		})
	}
}

// manyFields is a valid stream (written by arrow-go) of n int64 columns
// and one row.
func manyFields(t testing.TB, n int) []byte {
	fs := make([]arrow.Field, n)
	cols := make([]arrow.Array, n)
	for i := range fs {
		fs[i] = arrow.Field{Name: fmt.Sprintf("c%d", i), Type: arrow.PrimitiveTypes.Int64}
		bld := array.NewInt64Builder(memory.DefaultAllocator)
		bld.Append(int64(i))
		cols[i] = bld.NewArray()
	}
	sc := arrow.NewSchema(fs, nil)
	rec := array.NewRecordBatch(sc, cols, 1)
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(sc))
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
