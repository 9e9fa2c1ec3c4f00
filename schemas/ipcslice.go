package schemas

import (
	"encoding/binary"
	"io"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// sliceMessages reads the messages of a stream checkIPC accepted with
// bodies and metadata sliced from it, not copied (arrow-go's reader
// copies every body into a new buffer: a quarter of what decoding
// allocates). Decode uses it only when no array can alias the body
// (every non-empty buffer decompressed) or the body is its own (a zstd
// frame's contents), so rows never point into the caller's bytes.
type sliceMessages struct {
	b    []byte
	off  int
	msg  *ipc.Message
	refs atomic.Int64
}

func newSliceMessages(b []byte) *sliceMessages {
	s := &sliceMessages{b: b}
	s.refs.Add(1)
	return s
}

// Message returns the next message, valid until the next call (as
// arrow-go's). The framing was checked by checkIPC.
func (s *sliceMessages) Message() (*ipc.Message, error) {
	if s.msg != nil {
		s.msg.Release()
		s.msg = nil
	}
	b := s.b[s.off:]
	if len(b) < 4 {
		return nil, io.EOF
	}
	n, metaLen := 4, int(int32(binary.LittleEndian.Uint32(b)))
	if uint32(metaLen) == 0xFFFFFFFF {
		if len(b) < 8 {
			return nil, io.EOF
		}
		n, metaLen = 8, int(int32(binary.LittleEndian.Uint32(b[4:])))
	}
	if metaLen == 0 {
		return nil, io.EOF
	}
	if metaLen < 4 || metaLen > len(b)-n {
		return nil, corrupt("message metadata length %d at byte %d", metaLen, s.off)
	}
	meta := b[n : n+metaLen]
	root, ok := fbRoot(meta)
	if !ok {
		return nil, corrupt("bad flatbuffer root at byte %d", s.off)
	}
	bodyLen, _ := fbInt64(meta, root, 3)
	if bodyLen < 0 || bodyLen > int64(len(b)-n-metaLen) {
		return nil, corrupt("message body length %d at byte %d", bodyLen, s.off)
	}
	body := b[n+metaLen : n+metaLen+int(bodyLen)]
	s.off += n + metaLen + int(bodyLen)
	s.msg = ipc.NewMessage(memory.NewBufferBytes(meta), memory.NewBufferBytes(body))
	return s.msg, nil
}

func (s *sliceMessages) Retain() { s.refs.Add(1) }

func (s *sliceMessages) Release() {
	if s.refs.Add(-1) == 0 && s.msg != nil {
		s.msg.Release()
		s.msg = nil
	}
}
