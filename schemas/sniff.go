package schemas

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// BodyCodec names the wire codec of an encoded body (a CodecXxx value)
// without decoding it: a zstd frame is CodecZstd; an Arrow IPC stream is
// CodecArrowZstd, CodecLZ4 or CodecNone by the buffer compression its
// first record batch declares. The agent's spool keeps bodies without
// headers, so a replayed batch gets its Tapflow-Codec header from here,
// right even when nats.codec changed since it was spooled.
func BodyCodec(body []byte) (string, error) {
	if bytes.HasPrefix(body, zstdMagic) {
		return CodecZstd, nil
	}
	if len(body) == 0 {
		return "", fmt.Errorf("%w: empty body", ErrCorrupt)
	}
	// Walk the stream's messages (schema first) to the first record
	// batch; arrow-go does not expose the batch's compression field, so
	// this reads the few flatbuffer fields it needs.
	for off := 0; off < len(body); {
		meta, next, err := ipcMessage(body, off)
		if err != nil {
			return "", err
		}
		if meta == nil { // end-of-stream marker
			break
		}
		msg, ok := fbRoot(meta)
		if !ok {
			return "", fmt.Errorf("%w: bad arrow message at byte %d", ErrCorrupt, off)
		}
		const headerRecordBatch = 3 // flatbuf.MessageHeaderRecordBatch
		if t, _ := fbUint8(meta, msg, 1); t == headerRecordBatch {
			rb, ok := fbSub(meta, msg, 2)
			if !ok {
				return "", fmt.Errorf("%w: record batch without header", ErrCorrupt)
			}
			bc, ok := fbSub(meta, rb, 3)
			if !ok {
				return CodecNone, nil
			}
			switch c, _ := fbUint8(meta, bc, 0); c { // flatbuf.CompressionType
			case 0:
				return CodecLZ4, nil
			case 1:
				return CodecArrowZstd, nil
			default:
				return "", fmt.Errorf("%w: unknown arrow compression type %d", ErrCorrupt, c)
			}
		}
		off = next
	}
	return CodecNone, nil // schema only: an empty stream
}

// ipcMessage returns the flatbuffer metadata of the encapsulated message
// at off and the offset of the next one; nil metadata at end of stream.
func ipcMessage(b []byte, off int) (meta []byte, next int, err error) {
	if off+4 > len(b) {
		return nil, 0, fmt.Errorf("%w: truncated arrow stream", ErrCorrupt)
	}
	if binary.LittleEndian.Uint32(b[off:]) == 0xFFFFFFFF { // continuation marker
		off += 4
		if off+4 > len(b) {
			return nil, 0, fmt.Errorf("%w: truncated arrow stream", ErrCorrupt)
		}
	}
	n := int(int32(binary.LittleEndian.Uint32(b[off:])))
	off += 4
	if n == 0 {
		return nil, off, nil
	}
	if n < 0 || off+n > len(b) {
		return nil, 0, fmt.Errorf("%w: arrow message length %d beyond the body", ErrCorrupt, n)
	}
	meta = b[off : off+n]
	root, ok := fbRoot(meta)
	if !ok {
		return nil, 0, fmt.Errorf("%w: bad arrow message", ErrCorrupt)
	}
	bodyLen, _ := fbInt64(meta, root, 3)
	next = off + n + int(bodyLen)
	if bodyLen < 0 || next > len(b) || next < off {
		return nil, 0, fmt.Errorf("%w: arrow body length %d beyond the message", ErrCorrupt, bodyLen)
	}
	return meta, next, nil
}

// Minimal flatbuffer reading: a table starts with an int32 offset back to
// its vtable (uint16 size, uint16 table size, uint16 field offsets).

func fbRoot(b []byte) (int, bool) {
	if len(b) < 4 {
		return 0, false
	}
	t := int(binary.LittleEndian.Uint32(b))
	return t, t+4 <= len(b)
}

// fbField returns the absolute position of field i of the table at t.
func fbField(b []byte, t, i int) (int, bool) {
	if t < 0 || t+4 > len(b) {
		return 0, false
	}
	vt := t - int(int32(binary.LittleEndian.Uint32(b[t:])))
	if vt < 0 || vt+4 > len(b) {
		return 0, false
	}
	vtSize := int(binary.LittleEndian.Uint16(b[vt:]))
	slot := 4 + 2*i
	if slot+2 > vtSize || vt+slot+2 > len(b) {
		return 0, false
	}
	o := int(binary.LittleEndian.Uint16(b[vt+slot:]))
	if o == 0 {
		return 0, false
	}
	return t + o, true
}

func fbUint8(b []byte, t, i int) (uint8, bool) {
	p, ok := fbField(b, t, i)
	if !ok || p >= len(b) {
		return 0, false
	}
	return b[p], true
}

func fbInt64(b []byte, t, i int) (int64, bool) {
	p, ok := fbField(b, t, i)
	if !ok || p+8 > len(b) {
		return 0, false
	}
	return int64(binary.LittleEndian.Uint64(b[p:])), true
}

// fbSub follows the table-valued field i of the table at t.
func fbSub(b []byte, t, i int) (int, bool) {
	p, ok := fbField(b, t, i)
	if !ok || p+4 > len(b) {
		return 0, false
	}
	s := p + int(binary.LittleEndian.Uint32(b[p:]))
	return s, s+4 <= len(b)
}
