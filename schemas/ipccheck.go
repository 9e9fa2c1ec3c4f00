package schemas

import (
	"encoding/binary"
	"fmt"
	"math"
)

// checkIPC validates the structure of an Arrow IPC stream before arrow-go
// reads it. arrow-go trusts what a message declares: it allocates a
// metadata length, a field count or a decompressed buffer size before
// reading the bytes that should back them, and slices buffers by offsets
// it does not check. So every declared length, count and offset is
// checked here against the bytes present and the decoder's limits, and
// only streams of the flat shapes tapflow's schemas use are accepted: no
// nested types, no view types, at most maxWireFields columns.
//
// It returns what arrow-go will allocate on the Go heap outside its
// allocator (metadata copies and per-column objects), which Decode
// charges to the message's budget. Errors wrap ErrCorrupt, or ErrTooLarge
// for a batch beyond maxBytes or maxRecords.
// raw reports whether a batch holds a non-empty buffer stored
// uncompressed: arrow-go's arrays then alias the body.
func checkIPC(b []byte, maxBytes, maxRecords int64) (cost int64, raw bool, err error) {
	c := ipcChecker{b: b, maxBytes: maxBytes, maxRecords: maxRecords}
	if err := c.stream(); err != nil {
		return 0, false, err
	}
	return c.cost + c.pooled, c.raw, nil
}

// Limits of the stream shapes a wire decoder accepts (flow.v1 has 33
// columns; a newer minor adds a few).
const (
	maxWireFields    = 1024
	maxWireMessages  = 4096
	maxWireKeyValues = 256
	// ipcObjectCost is about what arrow-go allocates per column, node or
	// buffer of a message (Field, ArrayData, array and flatbuffer
	// objects), for the budget.
	ipcObjectCost = 512
)

// Flatbuffer enum values of Arrow's Message.fbs / Schema.fbs.
const (
	hdrSchema      = 1
	hdrDictBatch   = 2
	hdrRecordBatch = 3

	typeInt           = 2
	typeFloatingPoint = 3
	typeBinary        = 4
	typeUtf8          = 5
	typeBool          = 6
	typeTimestamp     = 10
	typeLargeBinary   = 19
	typeLargeUtf8     = 20

	metadataV4 = 3
	metadataV5 = 4
)

// ipcField is what checking a record batch needs of one schema field.
type ipcField struct {
	typ     uint8 // arrow type of the values (the dictionary's for a dictionary field)
	width   int   // bytes per value of a fixed-width type; 0: bits (bool); -1: variable
	offsets int   // bytes per offset of a variable-width type
	dictID  int64
	dict    bool
	index   int // bytes per dictionary index
}

type ipcChecker struct {
	b                    []byte
	maxBytes, maxRecords int64
	cost                 int64
	fields               []ipcField
	expanded             int64 // Σ buffer bytes after decompression, and zstd decoders
	pooled               int64 // the largest LZ4 block size
	rows                 int64 // Σ record batch rows
	raw                  bool  // a non-empty buffer stored uncompressed
}

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: arrow ipc: %s", ErrCorrupt, fmt.Sprintf(format, a...))
}

func (c *ipcChecker) stream() error {
	b := c.b
	for off, n := 0, 0; off < len(b); n++ {
		if n == maxWireMessages {
			return corrupt("more than %d messages in one stream", maxWireMessages)
		}
		if len(b)-off < 4 {
			return corrupt("truncated message at byte %d", off)
		}
		metaLen := int64(int32(binary.LittleEndian.Uint32(b[off:])))
		off += 4
		if uint32(metaLen) == 0xFFFFFFFF { // continuation marker
			if len(b)-off < 4 {
				return corrupt("truncated message length at byte %d", off)
			}
			metaLen = int64(int32(binary.LittleEndian.Uint32(b[off:])))
			off += 4
		}
		if metaLen == 0 {
			return nil // end-of-stream marker: arrow-go reads no further
		}
		if metaLen < 4 || metaLen > int64(len(b)-off) {
			return corrupt("message metadata length %d at byte %d: %d bytes left", metaLen, off-4, len(b)-off)
		}
		meta := b[off : off+int(metaLen)]
		off += int(metaLen)
		c.cost += metaLen + ipcObjectCost
		bodyLen, err := c.message(meta, n, b[off:])
		if err != nil {
			return err
		}
		off += int(bodyLen)
	}
	return nil // no end-of-stream marker: arrow-go stops at the end too
}

// message checks one message's metadata; rest is the bytes after it
// (its body first).
func (c *ipcChecker) message(m []byte, n int, rest []byte) (int64, error) {
	left := int64(len(rest))
	root, ok := fbRoot(m)
	if !ok {
		return 0, corrupt("message %d: bad flatbuffer root", n)
	}
	if v, ok := fbInt16(m, root, 0); !ok || (v != metadataV4 && v != metadataV5) {
		return 0, corrupt("message %d: metadata version %d, want V4 or V5", n, v)
	}
	bodyLen, _ := fbInt64(m, root, 3)
	if bodyLen < 0 || bodyLen > left {
		return 0, corrupt("message %d: body length %d, %d bytes left", n, bodyLen, left)
	}
	if err := c.keyValues(m, root, 4, "message custom metadata"); err != nil {
		return 0, err
	}
	hdr, ok := fbSub(m, root, 2)
	if !ok {
		return 0, corrupt("message %d: no header", n)
	}
	switch t, _ := fbUint8(m, root, 1); {
	case n == 0 && t != hdrSchema:
		return 0, corrupt("message 0: header type %d, want a schema", t)
	case t == hdrSchema && n != 0:
		return 0, corrupt("message %d: a second schema", n)
	case t == hdrSchema:
		return bodyLen, c.schema(m, hdr)
	case t == hdrDictBatch:
		id, _ := fbInt64(m, hdr, 0)
		var f *ipcField
		for i := range c.fields {
			if c.fields[i].dict && c.fields[i].dictID == id {
				f = &c.fields[i]
				break
			}
		}
		if f == nil {
			return 0, corrupt("message %d: dictionary batch for unknown id %d", n, id)
		}
		rb, ok := fbSub(m, hdr, 1)
		if !ok {
			return 0, corrupt("message %d: dictionary batch without data", n)
		}
		values := ipcField{typ: f.typ, width: f.width, offsets: f.offsets}
		return bodyLen, c.recordBatch(m, rb, n, rest[:bodyLen], []ipcField{values}, true)
	case t == hdrRecordBatch:
		cols := make([]ipcField, len(c.fields))
		for i, f := range c.fields {
			cols[i] = f
			if f.dict { // the batch holds the indices
				cols[i] = ipcField{typ: typeInt, width: f.index}
			}
		}
		return bodyLen, c.recordBatch(m, hdr, n, rest[:bodyLen], cols, false)
	default:
		return 0, corrupt("message %d: header type %d, want a schema, dictionary or record batch", n, t)
	}
}

func (c *ipcChecker) schema(m []byte, s int) error {
	if e, _ := fbInt16(m, s, 0); e != 0 {
		return corrupt("big-endian schema")
	}
	if err := c.keyValues(m, s, 2, "schema metadata"); err != nil {
		return err
	}
	if _, n, ok := fbVector(m, s, 3, 8); !ok || n > 64 {
		if ok || fbHas(m, s, 3) {
			return corrupt("schema features: bad or more than 64")
		}
	}
	v, n, ok := fbVector(m, s, 1, 4)
	if !ok {
		if fbHas(m, s, 1) {
			return corrupt("schema fields out of bounds")
		}
		n = 0
	}
	if n > maxWireFields {
		return corrupt("schema declares %d fields, at most %d", n, maxWireFields)
	}
	c.fields = make([]ipcField, n)
	for i := range n {
		f, ok := fbVectorTable(m, v, i)
		if !ok {
			return corrupt("field %d out of bounds", i)
		}
		if err := c.field(m, f, i); err != nil {
			return err
		}
	}
	c.cost += int64(n) * ipcObjectCost
	return nil
}

func (c *ipcChecker) field(m []byte, f, i int) error {
	if _, ok := fbString(m, f, 0); !ok && fbHas(m, f, 0) {
		return corrupt("field %d: name out of bounds", i)
	}
	if _, n, ok := fbVector(m, f, 5, 4); (ok && n > 0) || (!ok && fbHas(m, f, 5)) {
		return corrupt("field %d: nested types are not tapflow columns", i)
	}
	if err := c.keyValues(m, f, 6, "field metadata"); err != nil {
		return err
	}
	tt, _ := fbUint8(m, f, 2)
	typ, ok := fbSub(m, f, 3)
	if !ok {
		return corrupt("field %d: no type", i)
	}
	out := ipcField{typ: tt}
	switch tt {
	case typeInt:
		w, ok := intWidth(m, typ)
		if !ok {
			return corrupt("field %d: bad integer width", i)
		}
		out.width = w
	case typeFloatingPoint:
		p, _ := fbInt16(m, typ, 0)
		if p < 0 || p > 2 {
			return corrupt("field %d: floating point precision %d", i, p)
		}
		out.width = 2 << p
	case typeTimestamp:
		if _, ok := fbString(m, typ, 1); !ok && fbHas(m, typ, 1) {
			return corrupt("field %d: timezone out of bounds", i)
		}
		out.width = 8
	case typeBool:
		out.width = 0
	case typeBinary, typeUtf8:
		out.width, out.offsets = -1, 4
	case typeLargeBinary, typeLargeUtf8:
		out.width, out.offsets = -1, 8
	default:
		return corrupt("field %d: arrow type %d is not a tapflow column type", i, tt)
	}
	if d, ok := fbSub(m, f, 4); ok {
		out.dict = true
		out.dictID, _ = fbInt64(m, d, 0)
		it, ok := fbSub(m, d, 1)
		if !ok {
			out.index = 4 // int32, the spec's default
		} else if out.index, ok = intWidth(m, it); !ok {
			return corrupt("field %d: bad dictionary index width", i)
		}
		for _, g := range c.fields[:i] {
			if g.dict && g.dictID == out.dictID {
				return corrupt("field %d: dictionary id %d used twice", i, out.dictID)
			}
		}
	} else if fbHas(m, f, 4) {
		return corrupt("field %d: dictionary encoding out of bounds", i)
	}
	c.fields[i] = out
	return nil
}

func intWidth(m []byte, t int) (int, bool) {
	bits, ok := fbInt32(m, t, 0)
	switch {
	case !ok:
		return 0, false
	case bits == 8 || bits == 16 || bits == 32 || bits == 64:
		return int(bits / 8), true
	}
	return 0, false
}

// recordBatch checks a record batch (or a dictionary batch's data) of
// the flat columns cols against its body.
func (c *ipcChecker) recordBatch(m []byte, rb, n int, body []byte, cols []ipcField, dict bool) error {
	rows, _ := fbInt64(m, rb, 0)
	if rows < 0 || rows > math.MaxInt32 {
		return corrupt("message %d: %d rows", n, rows)
	}
	if !dict {
		if c.rows += rows; c.maxRecords > 0 && c.rows > c.maxRecords {
			return fmt.Errorf("%w: record batches declare %d records or more, limit %d", ErrTooLarge, c.rows, c.maxRecords)
		}
	}
	if _, k, ok := fbVector(m, rb, 4, 8); (ok && k > 0) || (!ok && fbHas(m, rb, 4)) {
		return corrupt("message %d: variadic buffers (view types) are not tapflow columns", n)
	}
	compressed := false
	var codec uint8
	var batchWork int64 // the decompressor's own memory, the largest frame's
	if bc, ok := fbSub(m, rb, 3); ok {
		codec, _ = fbUint8(m, bc, 0)
		method, _ := fbUint8(m, bc, 1)
		if codec > 1 || method != 0 {
			return corrupt("message %d: body compression %d/%d, want LZ4_FRAME or ZSTD per buffer", n, codec, method)
		}
		compressed = true
	} else if fbHas(m, rb, 3) {
		return corrupt("message %d: body compression out of bounds", n)
	}
	nodes, nn, ok := fbVector(m, rb, 1, 16)
	if !ok && (fbHas(m, rb, 1) || len(cols) > 0) {
		return corrupt("message %d: field nodes missing or out of bounds", n)
	}
	if nn != len(cols) {
		return corrupt("message %d: %d field nodes for %d columns", n, nn, len(cols))
	}
	bufs, nb, ok := fbVector(m, rb, 2, 16)
	if !ok && (fbHas(m, rb, 2) || len(cols) > 0) {
		return corrupt("message %d: buffers missing or out of bounds", n)
	}
	want := 0
	for _, f := range cols {
		want += 2
		if f.width < 0 {
			want++
		}
	}
	if nb != want {
		return corrupt("message %d: %d buffers for %d columns, want %d", n, nb, len(cols), want)
	}
	c.cost += int64(nn+nb) * ipcObjectCost
	bodyLen := int64(len(body))
	// size is buffer i's length once decompressed, as arrow-go reads it.
	size := func(i int) (int64, error) {
		p := bufs + 16*i
		off := int64(binary.LittleEndian.Uint64(m[p:]))
		l := int64(binary.LittleEndian.Uint64(m[p+8:]))
		if off < 0 || l < 0 || off > bodyLen || l > bodyLen-off {
			return 0, corrupt("message %d: buffer %d [%d, +%d) outside the %d-byte body", n, i, off, l, bodyLen)
		}
		if !compressed || l == 0 {
			c.raw = c.raw || l > 0
			return l, nil
		}
		if l < 8 {
			return 0, corrupt("message %d: compressed buffer %d of %d bytes, shorter than its length prefix", n, i, l)
		}
		u := int64(binary.LittleEndian.Uint64(body[off:]))
		switch {
		case u == -1: // stored uncompressed
			c.raw = true
			return l - 8, nil
		case u < 0:
			return 0, corrupt("message %d: buffer %d declares %d bytes uncompressed", n, i, u)
		}
		// arrow-go allocates u before decompressing, and its decoder
		// what the frame declares: count both now.
		work, err := codecWork(codec, body[off+8:off+l])
		if err != nil {
			return 0, corrupt("message %d: buffer %d: %v", n, i, err)
		}
		if codec == 0 {
			// LZ4 block buffers come from pools: once per message.
			c.pooled = max(c.pooled, work)
		} else {
			batchWork = max(batchWork, work)
		}
		if c.expanded += u; c.limit() < c.expanded+batchWork+c.pooled {
			return 0, fmt.Errorf("%w: arrow buffers and decompressors need %d bytes or more, limit %d", ErrTooLarge, c.expanded+batchWork+c.pooled, c.limit())
		}
		return u, nil
	}
	bi := 0
	for k, f := range cols {
		p := nodes + 16*k
		length := int64(binary.LittleEndian.Uint64(m[p:]))
		nulls := int64(binary.LittleEndian.Uint64(m[p+8:]))
		if length < 0 || length > math.MaxInt32 || nulls < 0 || nulls > length {
			return corrupt("message %d: column %d: length %d, %d nulls", n, k, length, nulls)
		}
		if !dict && length != rows {
			return corrupt("message %d: column %d: %d values in a batch of %d rows", n, k, length, rows)
		}
		if dict && c.maxRecords > 0 && length > c.maxRecords+maxDictSlack {
			return fmt.Errorf("%w: a dictionary of %d entries, limit %d", ErrTooLarge, length, c.maxRecords+maxDictSlack)
		}
		validity, err := size(bi)
		if err != nil {
			return err
		}
		if nulls > 0 && validity < (length+7)/8 {
			return corrupt("message %d: column %d: validity bitmap of %d bytes for %d values", n, k, validity, length)
		}
		data, err := size(bi + 1)
		if err != nil {
			return err
		}
		need := length * int64(f.width)
		if f.width == 0 {
			need = (length + 7) / 8
		} else if f.width < 0 {
			need = 0
			if length > 0 {
				need = (length + 1) * int64(f.offsets)
			}
		}
		if data < need {
			return corrupt("message %d: column %d: %d bytes for %d values, want %d", n, k, data, length, need)
		}
		if f.width < 0 {
			if _, err := size(bi + 2); err != nil {
				return err
			}
			bi++
		}
		bi += 2
	}
	c.expanded += batchWork
	c.cost += batchWork
	return nil
}

// codecWork walks the frames of one compressed buffer (LZ4_FRAME: 0,
// ZSTD: 1) and returns the memory the decompressor allocates for the
// largest of them: the zstd window or the LZ4 block size (its buffers
// are pooled), as the frame header declares. Every frame is walked,
// since a stream decoder goes on to the next frame when one ends short.
func codecWork(codec uint8, b []byte) (int64, error) {
	var work int64
	for len(b) > 0 {
		if len(b) >= 8 && binary.LittleEndian.Uint32(b)&0xFFFFFFF0 == 0x184D2A50 { // skippable frame, both formats
			n := int64(binary.LittleEndian.Uint32(b[4:]))
			if n > int64(len(b)-8) {
				return 0, fmt.Errorf("skippable frame of %d bytes beyond the buffer", n)
			}
			b = b[8+n:]
			continue
		}
		var (
			w   int64
			err error
		)
		if codec == 1 {
			w, b, err = zstdFrame(b)
		} else {
			w, b, err = lz4Frame(b)
		}
		if err != nil {
			return 0, err
		}
		work = max(work, w)
	}
	return work, nil
}

// zstdFrame checks one zstd frame (RFC 8878) and returns its window's
// cost and the bytes after it.
func zstdFrame(b []byte) (int64, []byte, error) {
	if len(b) < 6 || binary.LittleEndian.Uint32(b) != 0xFD2FB528 {
		return 0, nil, fmt.Errorf("not a zstd frame")
	}
	fhd := b[4]
	single := fhd&0x20 != 0
	if fhd&0x08 != 0 {
		return 0, nil, fmt.Errorf("zstd frame header: reserved bit set")
	}
	p := 5
	var window int64
	if !single {
		wd := b[p]
		p++
		base := int64(1) << (10 + wd>>3)
		window = base + base/8*int64(wd&7)
	}
	p += [4]int{0, 1, 2, 4}[fhd&3]
	fcsSize := [4]int{0, 2, 4, 8}[fhd>>6]
	if fhd>>6 == 0 && single {
		fcsSize = 1
	}
	if p+fcsSize > len(b) {
		return 0, nil, fmt.Errorf("truncated zstd frame header")
	}
	if single {
		var fcs uint64
		for i := fcsSize - 1; i >= 0; i-- {
			fcs = fcs<<8 | uint64(b[p+i])
		}
		if fcsSize == 2 {
			fcs += 256
		}
		if fcs > math.MaxInt32 {
			return 0, nil, fmt.Errorf("zstd frame declares %d bytes", fcs)
		}
		window = max(int64(fcs), 1<<10)
	}
	p += fcsSize
	for last := false; !last; {
		if p+3 > len(b) {
			return 0, nil, fmt.Errorf("truncated zstd block header")
		}
		h := uint32(b[p]) | uint32(b[p+1])<<8 | uint32(b[p+2])<<16
		p += 3
		last = h&1 != 0
		size := int(h >> 3)
		switch (h >> 1) & 3 {
		case 1: // RLE: one byte
			size = 1
		case 3:
			return 0, nil, fmt.Errorf("reserved zstd block type")
		}
		if size > len(b)-p {
			return 0, nil, fmt.Errorf("zstd block of %d bytes beyond the buffer", size)
		}
		p += size
	}
	if fhd&0x04 != 0 {
		p += 4
		if p > len(b) {
			return 0, nil, fmt.Errorf("truncated zstd checksum")
		}
	}
	// The stream decoder's ring (the window plus two blocks' room) and
	// the block buffers of its (up to 4) block decoders.
	return window + 6*(min(window, 128<<10)+64) + 8<<10, b[p:], nil
}

// lz4Frame checks one LZ4 frame and returns its block size (the
// decoder's block buffers come from pools, mostly reused) and the bytes
// after it.
func lz4Frame(b []byte) (int64, []byte, error) {
	if len(b) < 7 || binary.LittleEndian.Uint32(b) != 0x184D2204 {
		return 0, nil, fmt.Errorf("not an LZ4 frame")
	}
	flg, bd := b[4], b[5]
	if flg>>6 != 1 || flg&0x02 != 0 || bd&0x8F != 0 {
		return 0, nil, fmt.Errorf("LZ4 frame header: bad version or reserved bits")
	}
	bs := int64(1) << (2*((bd>>4)&7) + 8)
	if (bd>>4)&7 < 4 {
		return 0, nil, fmt.Errorf("LZ4 frame header: block size code %d", (bd>>4)&7)
	}
	p := 6
	if flg&0x08 != 0 {
		p += 8
	}
	if flg&0x01 != 0 {
		p += 4
	}
	p++ // header checksum
	for {
		if p+4 > len(b) {
			return 0, nil, fmt.Errorf("truncated LZ4 block")
		}
		size := int64(binary.LittleEndian.Uint32(b[p:]) &^ (1 << 31))
		p += 4
		if size == 0 {
			break
		}
		if size > bs || size > int64(len(b)-p) {
			return 0, nil, fmt.Errorf("LZ4 block of %d bytes, block size %d, %d left", size, bs, len(b)-p)
		}
		p += int(size)
		if flg&0x10 != 0 {
			p += 4
		}
	}
	if flg&0x04 != 0 {
		p += 4
	}
	if p > len(b) {
		return 0, nil, fmt.Errorf("truncated LZ4 frame")
	}
	return bs, b[p:], nil
}

func (c *ipcChecker) limit() int64 {
	if c.maxBytes > 0 {
		return c.maxBytes
	}
	return maxDecodedBody
}

// keyValues checks the optional [KeyValue] field i of the table at t.
func (c *ipcChecker) keyValues(m []byte, t, i int, what string) error {
	v, n, ok := fbVector(m, t, i, 4)
	if !ok {
		if fbHas(m, t, i) {
			return corrupt("%s out of bounds", what)
		}
		return nil
	}
	if n > maxWireKeyValues {
		return corrupt("%s: %d entries, at most %d", what, n, maxWireKeyValues)
	}
	for k := range n {
		kv, ok := fbVectorTable(m, v, k)
		if !ok {
			return corrupt("%s: entry %d out of bounds", what, k)
		}
		for j := 0; j < 2; j++ {
			if _, ok := fbString(m, kv, j); !ok && fbHas(m, kv, j) {
				return corrupt("%s: entry %d out of bounds", what, k)
			}
		}
	}
	c.cost += int64(n) * ipcObjectCost
	return nil
}

// fbHas reports whether field i of the table at t is present.
func fbHas(b []byte, t, i int) bool {
	_, ok := fbField(b, t, i)
	return ok
}

func fbInt16(b []byte, t, i int) (int16, bool) {
	p, ok := fbField(b, t, i)
	if !ok || p+2 > len(b) {
		return 0, false
	}
	return int16(binary.LittleEndian.Uint16(b[p:])), true
}

func fbInt32(b []byte, t, i int) (int32, bool) {
	p, ok := fbField(b, t, i)
	if !ok || p+4 > len(b) {
		return 0, false
	}
	return int32(binary.LittleEndian.Uint32(b[p:])), true
}

// fbVector follows the vector-valued field i of the table at t: the
// position of its first element and its length, checked to fit in b with
// elements of size bytes.
func fbVector(b []byte, t, i, size int) (start, n int, ok bool) {
	p, ok := fbField(b, t, i)
	if !ok || p+4 > len(b) {
		return 0, 0, false
	}
	v := p + int(binary.LittleEndian.Uint32(b[p:]))
	if v+4 > len(b) || v < p {
		return 0, 0, false
	}
	l := uint64(binary.LittleEndian.Uint32(b[v:]))
	if l > uint64(len(b)-v-4)/uint64(size) {
		return 0, 0, false
	}
	return v + 4, int(l), true
}

// fbVectorTable is the table element k of a vector of tables at start.
func fbVectorTable(b []byte, start, k int) (int, bool) {
	e := start + 4*k
	if e+4 > len(b) {
		return 0, false
	}
	t := e + int(binary.LittleEndian.Uint32(b[e:]))
	return t, t >= e && t+4 <= len(b)
}

// fbString is the string field i of the table at t, checked in bounds.
func fbString(b []byte, t, i int) ([]byte, bool) {
	s, n, ok := fbVector(b, t, i, 1)
	if !ok {
		return nil, false
	}
	return b[s : s+n], true
}
