package spool

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"
)

const (
	segHeader   = "TFSPOOL\x01"
	frameMagic  = 0x31534654 // "TFS1" little-endian
	frameHdrLen = 12
	// MaxFrame bounds one entry's payload: a larger length field is corrupt.
	// The largest NATS message tapflow sends is 8 MiB.
	MaxFrame       = 64 << 20
	payloadVersion = 1
	fixedPayload   = 1 + 8 + 8 + 4 + 2 + 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Entry is one spooled NATS message (one agent batch).
type Entry struct {
	// Seq is the agent batch_seq of the message.
	Seq int64
	// Created is when the entry was spooled.
	Created time.Time
	// Records is the number of flow records in Body (for loss accounting).
	Records int
	// MsgID is the Nats-Msg-Id the message is published with.
	MsgID string
	// Subject is the NATS subject.
	Subject string
	// Body is the encoded message (Arrow IPC).
	Body []byte
}

// frameSize is the number of bytes e takes in a segment.
func (e *Entry) frameSize() int64 {
	return int64(frameHdrLen + fixedPayload + len(e.MsgID) + len(e.Subject) + len(e.Body))
}

// appendFrame appends e's frame to dst.
func appendFrame(dst []byte, e *Entry) ([]byte, error) {
	if len(e.MsgID) > 0xffff || len(e.Subject) > 0xffff {
		return dst, errors.New("spool: message id or subject longer than 65535 bytes")
	}
	n := fixedPayload + len(e.MsgID) + len(e.Subject) + len(e.Body)
	if n > MaxFrame {
		return dst, fmt.Errorf("spool: entry of %d bytes exceeds the %d-byte frame limit", n, MaxFrame)
	}
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, frameMagic)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	dst = binary.LittleEndian.AppendUint32(dst, 0) // crc, filled below
	p := len(dst)
	dst = append(dst, payloadVersion)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Seq))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Created.UnixMicro()))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(e.Records))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(e.MsgID)))
	dst = append(dst, e.MsgID...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(e.Subject)))
	dst = append(dst, e.Subject...)
	dst = append(dst, e.Body...)
	binary.LittleEndian.PutUint32(dst[start+8:], crc32.Checksum(dst[p:], castagnoli))
	return dst, nil
}

// decodePayload parses a payload whose checksum has been verified. Body
// aliases p.
func decodePayload(p []byte) (Entry, error) {
	var e Entry
	if len(p) < fixedPayload || p[0] != payloadVersion {
		return e, errors.New("bad payload header")
	}
	e.Seq = int64(binary.LittleEndian.Uint64(p[1:]))
	e.Created = time.UnixMicro(int64(binary.LittleEndian.Uint64(p[9:])))
	e.Records = int(binary.LittleEndian.Uint32(p[17:]))
	rest := p[21:]
	idLen := int(binary.LittleEndian.Uint16(rest))
	rest = rest[2:]
	if idLen+2 > len(rest) {
		return e, errors.New("message id overruns the payload")
	}
	e.MsgID = string(rest[:idLen])
	rest = rest[idLen:]
	subLen := int(binary.LittleEndian.Uint16(rest))
	rest = rest[2:]
	if subLen > len(rest) {
		return e, errors.New("subject overruns the payload")
	}
	e.Subject = string(rest[:subLen])
	e.Body = rest[subLen:]
	return e, nil
}

// Problem is a stretch of a segment that did not hold valid frames.
type Problem struct {
	// Offset and Length locate the bad bytes in the segment.
	Offset, Length int64
	// Torn is true when the stretch runs to the end of the segment: an
	// append that did not finish (truncating it loses nothing that was
	// acknowledged as spooled... except the torn entry itself).
	Torn bool
	// Reason says what was wrong.
	Reason string
}

// scanner reads frames from one segment sequentially, verifying each, and
// resynchronises after a corrupt stretch by searching for the next frame
// whose magic, length and checksum are valid. It holds one frame in memory.
type scanner struct {
	ra   io.ReaderAt // the segment file
	r    *bufio.Reader
	size int64 // segment size
	off  int64 // offset of the next byte r returns
	buf  []byte
	hdr  [frameHdrLen]byte

	// reread counts the payload bytes read for candidate frames whose
	// checksum failed. A hostile or badly damaged segment can hold a
	// plausible frame header at every few bytes, each claiming the rest
	// of the segment: checking them all is quadratic in the segment's
	// size. Past rereadBudget the rest of the segment is one corrupt
	// stretch.
	reread int64

	problems []Problem
}

// rereadBudget bounds the resynchronisation work of one scan: a segment's
// worth plus one largest frame (ordinary damage costs one frame).
func (s *scanner) rereadBudget() int64 { return s.size + MaxFrame }

func newScanner(ra io.ReaderAt, off, size int64) *scanner {
	s := &scanner{ra: ra}
	s.reset(off, size, 256<<10)
	return s
}

// reset positions the scanner at off in a segment of size bytes.
func (s *scanner) reset(off, size int64, bufSize int) {
	r := io.NewSectionReader(s.ra, off, max(size-off, 0))
	if s.r == nil {
		s.r = bufio.NewReaderSize(r, bufSize)
	} else {
		s.r.Reset(r)
	}
	s.off, s.size, s.reread, s.problems = off, size, 0, s.problems[:0]
}

// next returns the next valid entry and the offset of its frame, or io.EOF
// at the end of the segment. Corrupt stretches are recorded in problems.
func (s *scanner) next() (Entry, int64, error) {
	badStart := int64(-1)
	var reason string
	for {
		if s.off >= s.size {
			if badStart >= 0 {
				s.problems = append(s.problems, Problem{Offset: badStart, Length: s.size - badStart, Torn: true, Reason: reason})
			}
			return Entry{}, 0, io.EOF
		}
		e, start, why, err := s.tryFrame()
		if err != nil {
			return Entry{}, 0, err
		}
		if why == "" {
			if badStart >= 0 {
				s.problems = append(s.problems, Problem{Offset: badStart, Length: start - badStart, Reason: reason})
			}
			return e, start, nil
		}
		if badStart < 0 {
			badStart, reason = start, why
		}
	}
}

// tryFrame attempts to read a frame at the current offset. When the bytes
// there are not a valid frame it consumes one byte and returns why.
func (s *scanner) tryFrame() (e Entry, start int64, why string, err error) {
	start = s.off
	remain := s.size - s.off
	if remain < frameHdrLen {
		return e, start, s.skip(1, "short frame header at the end"), nil
	}
	peek, err := s.r.Peek(frameHdrLen)
	if err != nil {
		return e, start, "", fmt.Errorf("read at %d: %w", s.off, err)
	}
	if binary.LittleEndian.Uint32(peek) != frameMagic {
		return e, start, s.skip(1, "bad frame magic"), nil
	}
	n := int64(binary.LittleEndian.Uint32(peek[4:]))
	sum := binary.LittleEndian.Uint32(peek[8:])
	if n < fixedPayload || n > MaxFrame {
		return e, start, s.skip(1, fmt.Sprintf("frame length %d out of range", n)), nil
	}
	if frameHdrLen+n > remain {
		return e, start, s.skip(1, fmt.Sprintf("frame of %d bytes runs past the end of the segment", n)), nil
	}
	// Peek cannot hold large frames: read header + payload into buf, and
	// on a bad checksum step back by re-reading (rare: only on corruption).
	if cap(s.buf) < int(frameHdrLen+n) {
		s.buf = make([]byte, frameHdrLen+n)
	}
	buf := s.buf[:frameHdrLen+n]
	if _, err := io.ReadFull(s.r, buf); err != nil {
		return e, start, "", fmt.Errorf("read frame at %d: %w", start, err)
	}
	if crc32.Checksum(buf[frameHdrLen:], castagnoli) != sum {
		s.reread += n
		if s.reread > s.rereadBudget() {
			why := fmt.Sprintf("checksum mismatch; more than %d bytes of candidate frames failed their checksum, the rest of the segment is not searched", s.rereadBudget())
			s.r.Reset(io.NewSectionReader(s.ra, s.size, 0))
			s.off = s.size
			return e, start, why, nil
		}
		// Resume the search at start+1 (re-reading: rare, only on corruption).
		s.r.Reset(io.NewSectionReader(s.ra, start+1, s.size-start-1))
		s.off = start + 1
		return e, start, "checksum mismatch", nil
	}
	e, derr := decodePayload(buf[frameHdrLen:])
	s.off = start + frameHdrLen + n
	if derr != nil {
		return e, start, derr.Error(), nil
	}
	return e, start, "", nil
}

func (s *scanner) skip(n int, why string) string {
	_, _ = s.r.Discard(n)
	s.off += int64(n)
	return why
}
