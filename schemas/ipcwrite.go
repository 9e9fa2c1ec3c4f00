package schemas

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	flatbuffers "github.com/google/flatbuffers/go"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// The Arrow IPC stream writer of the encoders. It writes what arrow-go's
// ipc.Writer writes for one record batch — the schema message, one
// dictionary batch per dictionary column, the record batch, the
// end-of-stream marker — byte for byte (TestIPCWriterSameBytes), but
// from the columns' own buffers and with its flatbuffer builder,
// compressor and scratch kept between messages: arrow-go's writer made
// most of an encoder's allocations (a schema, payloads, builders and
// compressors for every dictionary and message). The schema message
// depends only on the table, the form and the index widths, so each
// encoder keeps the few it meets (schemaCache).
//
// It writes what the tables build (wireColumn): fixed-width integers,
// utf8 and dictionary<int8|int16|int32, utf8>, without nulls.

// Arrow IPC constants (format/Message.fbs, Schema.fbs).
const (
	ipcMetadataV5             = 4 // MetadataVersion.V5
	ipcHeaderDictionary       = 2 // MessageHeader.DictionaryBatch
	ipcHeaderRecordBatch      = 3 // MessageHeader.RecordBatch
	ipcContinuation           = 0xFFFFFFFF
	ipcCodecLZ4Frame     int8 = 0 // CompressionType.LZ4_FRAME
	ipcCodecZstd         int8 = 1 // CompressionType.ZSTD
	ipcCodecNone         int8 = -1
	lz4BlockMax               = 64 << 10 // arrow-go's (and Arrow C++'s) LZ4 frame block size
)

// ipcEOS ends a stream.
var ipcEOS = []byte{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0}

// lz4FrameHeader starts every LZ4 frame of a body buffer: magic, FLG
// (version 1, independent blocks, no checksums, no content size), BD
// (64 KB blocks) and the descriptor's checksum byte.
var lz4FrameHeader = []byte{0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82}

// ipcWriter is the state of one message being written; an encoder keeps
// one per column arena.
type ipcWriter struct {
	codec int8
	fb    *flatbuffers.Builder
	// The message being built: its field nodes (lengths; no nulls),
	// its body buffers in order (nil: absent) and their compressed form.
	nodes []int64
	bufs  [][]byte
	comp  []byte // compressed buffers back to back
	ends  []int  // end of each buffer's compressed form in comp
	lz4   lz4.Compressor
	zstd  *zstd.Encoder
	key   []byte // schema cache key
}

func (w *ipcWriter) reset(codec int8) {
	w.codec = codec
	if w.fb == nil {
		w.fb = flatbuffers.NewBuilder(1024)
	}
}

// write appends the stream of one record batch of n rows, cols, to dst.
// schema is the message's schema message (framed).
func (w *ipcWriter) write(dst []byte, schema []byte, cols []wireColumn, n int) ([]byte, error) {
	defer func() { clear(w.bufs) }() // no message's buffers kept alive
	dst = append(dst, schema...)
	var id int64
	for _, c := range cols {
		if c.typ.ID() != arrow.DICTIONARY {
			continue
		}
		w.nodes = append(w.nodes[:0], int64(c.dictLen))
		w.bufs = append(w.bufs[:0], nil, c.offs, c.data)
		var err error
		if dst, err = w.message(dst, ipcHeaderDictionary, id, int64(c.dictLen)); err != nil {
			return nil, err
		}
		id++
	}
	w.nodes, w.bufs = w.nodes[:0], w.bufs[:0]
	for _, c := range cols {
		w.nodes = append(w.nodes, int64(c.n))
		// No validity buffer: the encoders write no nulls.
		if c.typ.ID() == arrow.STRING {
			w.bufs = append(w.bufs, nil, c.offs, c.data)
		} else {
			w.bufs = append(w.bufs, nil, c.vals)
		}
	}
	dst, err := w.message(dst, ipcHeaderRecordBatch, 0, int64(n))
	if err != nil {
		return nil, err
	}
	return append(dst, ipcEOS...), nil
}

// message appends one framed message of w's nodes and buffers: a
// record batch of length rows, or the dictionary batch id.
func (w *ipcWriter) message(dst []byte, header byte, id, length int64) ([]byte, error) {
	body := w.bufs
	if w.codec != ipcCodecNone {
		if err := w.compress(); err != nil {
			return nil, err
		}
	}
	b := w.fb
	b.Reset()
	// Field nodes and buffers are vectors of structs, written last to
	// first (arrow-go's recordToFB, whose bytes these are).
	b.StartVector(16, len(w.nodes), 8)
	for i := len(w.nodes) - 1; i >= 0; i-- {
		b.Prep(8, 16)
		b.PrependInt64(0) // null count
		b.PrependInt64(w.nodes[i])
	}
	nodes := b.EndVector(len(w.nodes))
	b.StartVector(16, len(body), 8)
	bodyLen := int64(0)
	for i := range body {
		bodyLen += pad8(w.bufLen(i))
	}
	off := bodyLen
	for i := len(body) - 1; i >= 0; i-- {
		n := w.bufLen(i)
		off -= pad8(n)
		b.Prep(8, 16)
		b.PrependInt64(n)
		b.PrependInt64(off)
	}
	buffers := b.EndVector(len(body))
	var compression flatbuffers.UOffsetT
	if w.codec != ipcCodecNone {
		b.StartObject(2)
		b.PrependInt8Slot(0, w.codec, 0)
		b.PrependInt8Slot(1, 0, 0) // BodyCompressionMethod.BUFFER
		compression = b.EndObject()
	}
	b.StartObject(5) // RecordBatch
	b.PrependInt64Slot(0, length, 0)
	b.PrependUOffsetTSlot(1, nodes, 0)
	b.PrependUOffsetTSlot(2, buffers, 0)
	if w.codec != ipcCodecNone {
		b.PrependUOffsetTSlot(3, compression, 0)
	}
	hdr := b.EndObject()
	if header == ipcHeaderDictionary {
		b.StartObject(3) // DictionaryBatch
		b.PrependInt64Slot(0, id, 0)
		b.PrependUOffsetTSlot(1, hdr, 0)
		b.PrependBoolSlot(2, false, false) // isDelta
		hdr = b.EndObject()
	}
	b.StartObject(5) // Message
	b.PrependInt16Slot(0, ipcMetadataV5, 0)
	b.PrependByteSlot(1, header, 0)
	b.PrependUOffsetTSlot(2, hdr, 0)
	b.PrependInt64Slot(3, bodyLen, 0)
	b.Finish(b.EndObject())
	dst = appendFramed(dst, b.FinishedBytes())

	dst = slices.Grow(dst, int(bodyLen))
	for i := range body {
		var p []byte
		if w.codec == ipcCodecNone {
			p = body[i]
		} else {
			p = w.comp[w.start(i):w.ends[i]]
		}
		dst = append(dst, p...)
		dst = append(dst, ipcPadding[:pad8(int64(len(p)))-int64(len(p))]...)
	}
	return dst, nil
}

var ipcPadding [8]byte

func pad8(n int64) int64 { return (n + 7) &^ 7 }

// appendFramed appends one message's metadata with its continuation
// marker, length and padding to 8 bytes.
func appendFramed(dst, meta []byte) []byte {
	size := (len(meta) + 8 + 7) &^ 7
	dst = binary.LittleEndian.AppendUint32(dst, ipcContinuation)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(size-8))
	dst = append(dst, meta...)
	return append(dst, ipcPadding[:size-8-len(meta)]...)
}

// bufLen is the length on the wire of body buffer i.
func (w *ipcWriter) bufLen(i int) int64 {
	if w.codec == ipcCodecNone {
		return int64(len(w.bufs[i]))
	}
	return int64(w.ends[i] - w.start(i))
}

func (w *ipcWriter) start(i int) int {
	if i == 0 {
		return 0
	}
	return w.ends[i-1]
}

// compress writes each non-empty buffer as the spec's compressed buffer
// (its length, then one frame) into comp; an empty one stays empty.
func (w *ipcWriter) compress() error {
	w.comp, w.ends = w.comp[:0], w.ends[:0]
	for _, p := range w.bufs {
		if len(p) > 0 {
			w.comp = binary.LittleEndian.AppendUint64(w.comp, uint64(len(p)))
			switch w.codec {
			case ipcCodecLZ4Frame:
				w.comp = w.appendLZ4(w.comp, p)
			case ipcCodecZstd:
				if err := w.appendZstd(p); err != nil {
					return err
				}
			}
		}
		w.ends = append(w.ends, len(w.comp))
	}
	return nil
}

// appendLZ4 appends src as one LZ4 frame, in 64 KB blocks, each
// compressed or, when that would not make it smaller, stored.
func (w *ipcWriter) appendLZ4(dst, src []byte) []byte {
	dst = append(dst, lz4FrameHeader...)
	for len(src) > 0 {
		block := src[:min(len(src), lz4BlockMax)]
		src = src[len(block):]
		at := len(dst)
		dst = slices.Grow(dst, 4+len(block))[:at+4]
		// A destination as long as the block: CompressBlock gives up
		// (0) when the block does not shrink.
		n, _ := w.lz4.CompressBlock(block, dst[at+4:at+4+len(block)])
		if n == 0 {
			binary.LittleEndian.PutUint32(dst[at:], uint32(len(block))|1<<31)
			dst = append(dst, block...)
			continue
		}
		binary.LittleEndian.PutUint32(dst[at:], uint32(n))
		dst = dst[:at+4+n]
	}
	return binary.LittleEndian.AppendUint32(dst, 0) // end mark
}

// appendZstd appends src as one zstd frame as arrow-go's writer makes
// it (a streaming encoder's frame, default level).
func (w *ipcWriter) appendZstd(src []byte) error {
	if w.zstd == nil {
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			return fmt.Errorf("encode arrow ipc: zstd: %w", err)
		}
		w.zstd = enc
	}
	w.zstd.Reset((*appendWriter)(&w.comp))
	if _, err := w.zstd.Write(src); err != nil {
		return fmt.Errorf("encode arrow ipc: zstd: %w", err)
	}
	if err := w.zstd.Close(); err != nil {
		return fmt.Errorf("encode arrow ipc: zstd: %w", err)
	}
	return nil
}

// appendWriter appends what is written to a byte slice.
type appendWriter []byte

func (a *appendWriter) Write(p []byte) (int, error) {
	*a = append(*a, p...)
	return len(p), nil
}

var _ io.Writer = (*appendWriter)(nil)

// schemaCache keeps an encoder's framed schema messages by form and
// index widths; a few distinct ones are usual, maxSchemas bounds them.
type schemaCache struct {
	mu   sync.Mutex
	msgs map[string][]byte
}

const maxSchemas = 64

// get returns the framed schema message for cols in form, building it
// from schema() with arrow-go when it is not kept. key is scratch.
func (c *schemaCache) get(key *[]byte, schema func() *arrow.Schema, form wireForm, cols []wireColumn) []byte {
	k := append((*key)[:0], byte(form))
	for _, col := range cols {
		if d, ok := col.typ.(*arrow.DictionaryType); ok {
			k = append(k, byte(d.IndexType.(arrow.FixedWidthDataType).BitWidth()))
		} else {
			k = append(k, 0)
		}
	}
	*key = k
	c.mu.Lock()
	msg, ok := c.msgs[string(k)]
	c.mu.Unlock()
	if ok {
		return msg
	}
	p := ipc.GetSchemaPayload(schema(), memory.DefaultAllocator)
	defer p.Release()
	meta := p.Meta()
	defer meta.Release()
	msg = appendFramed(nil, meta.Bytes())
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.msgs == nil {
		c.msgs = make(map[string][]byte)
	}
	if len(c.msgs) < maxSchemas {
		c.msgs[string(k)] = msg
	}
	return msg
}
