package spool

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A segment as an agent reads it back after a crash, a disk fault or a
// hostile write: Inspect (spool inspect/verify), then Open and a full
// replay. No panic, no allocation beyond the bytes present, and every
// entry returned is one whose frame fits in the segment.

func fuzzSegment(t testing.TB, entries ...Entry) []byte {
	b := []byte(segHeader)
	var err error
	for i := range entries {
		if b, err = appendFrame(b, &entries[i]); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func fuzzEntry(seq int64, body string) Entry {
	return Entry{Seq: seq, Created: time.Unix(1700000000, 0), Records: 3, MsgID: "cmp7-flows-1", Subject: "tapflow.flows.v1.cmp7", Body: []byte(body)}
}

// resyncBomb is a segment whose every 12 bytes hold a frame header
// claiming the rest of the segment, with a wrong checksum: before the
// reread budget, scanning it read every candidate whole.
func resyncBomb(size int) []byte {
	b := []byte(segHeader)
	for len(b)+frameHdrLen+fixedPayload <= size {
		rest := size - len(b) - frameHdrLen
		if rest < fixedPayload+frameHdrLen+fixedPayload {
			b = binary.LittleEndian.AppendUint32(b, frameMagic)
			b = binary.LittleEndian.AppendUint32(b, uint32(rest))
			b = binary.LittleEndian.AppendUint32(b, 0xdeadbeef)
			return append(b, make([]byte, rest)...)
		}
		b = binary.LittleEndian.AppendUint32(b, frameMagic)
		b = binary.LittleEndian.AppendUint32(b, uint32(rest))
		b = binary.LittleEndian.AppendUint32(b, 0xdeadbeef)
	}
	return b
}

func FuzzSegment(f *testing.F) {
	good := fuzzSegment(f, fuzzEntry(1, "body-one"), fuzzEntry(2, ""), fuzzEntry(3, "body-three"))
	f.Add(good, "1 8")
	f.Add(good, "")
	f.Add(good[:len(good)-3], "1 8")     // torn tail
	f.Add(good[:len(segHeader)], "1 8")  // header only
	f.Add([]byte("TFSPOOL"), "1 0")      // short header
	f.Add(good, "1 -5")                  // negative cursor
	f.Add(good, "1 9223372036854775807") // cursor past the end
	f.Add(good, "9223372036854775807 8") // cursor segment far ahead
	f.Add(good, "garbage")               // unreadable cursor
	flip := append([]byte(nil), good...)
	flip[len(segHeader)+frameHdrLen+3] ^= 0x40 // checksum mismatch in the first frame
	f.Add(flip, "1 8")
	bad := fuzzSegment(f, Entry{MsgID: string(make([]byte, 10)), Subject: "s"})
	binary.LittleEndian.PutUint16(bad[len(segHeader)+frameHdrLen+21:], 0xffff) // id overruns (checksum then fails: the scanner's path)
	f.Add(bad, "1 8")
	f.Add(resyncBomb(4<<10), "1 8")
	f.Fuzz(func(t *testing.T, seg []byte, cursor string) {
		dir := t.TempDir()
		if err := os.WriteFile(segPath(dir, 1), seg, 0o600); err != nil {
			t.Fatal(err)
		}
		if cursor != "" {
			if err := os.WriteFile(filepath.Join(dir, cursorName), []byte(cursor), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		maxEntries := len(seg) / (frameHdrLen + fixedPayload)
		if r, err := Inspect(dir); err == nil {
			var n int64
			for _, s := range r.Segments {
				n += s.Entries
			}
			if n > int64(maxEntries) {
				t.Fatalf("inspect: %d entries in %d bytes", n, len(seg))
			}
		}
		cfg := DefaultConfig()
		cfg.Dir = dir
		s, err := New(cfg, Options{Logger: quiet, Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Open(); err != nil {
			return
		}
		defer s.Close()
		for i := 0; ; i++ {
			e, ok, err := s.Peek()
			if err != nil || !ok {
				break
			}
			if i >= maxEntries {
				t.Fatalf("replayed more than %d entries from %d bytes", maxEntries, len(seg))
			}
			if e.frameSize() > int64(len(seg)) {
				t.Fatalf("entry of %d bytes from a %d-byte segment", e.frameSize(), len(seg))
			}
			if err := s.Advance(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestResyncIsBounded: a segment of candidate frames that all fail their
// checksum is scanned in linear time (the reread budget), as one corrupt
// stretch.
func TestResyncIsBounded(t *testing.T) {
	for _, size := range []int{64 << 10, 1 << 20} {
		dir := t.TempDir()
		bomb := resyncBomb(size)
		size := len(bomb)
		if err := os.WriteFile(segPath(dir, 1), bomb, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(segPath(dir, 1))
		if err != nil {
			t.Fatal(err)
		}
		sc := newScanner(f, int64(len(segHeader)), int64(size))
		for {
			if _, _, err := sc.next(); err != nil {
				break
			}
		}
		f.Close()
		if sc.reread > sc.rereadBudget()+int64(size) {
			t.Errorf("%d-byte segment: %d bytes reread, budget %d", size, sc.reread, sc.rereadBudget())
		}
		if len(sc.problems) != 1 {
			t.Errorf("%d-byte segment: %d problems, want the whole segment as one: %+v", size, len(sc.problems), sc.problems)
		}
	}
}
