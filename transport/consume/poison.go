package consume

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Poison detection: a message the collector process dies on (an
// allocation no recover catches, a runtime fatal error) is never acked,
// so JetStream redelivers it after ack_wait to the next collector, which
// dies again. JetStream's delivery count alone cannot tell the culprit:
// every message held when the process died is redelivered together with
// it, in the same burst, and dies with it again (their files never get
// to commit), and a sink failure nacks healthy messages every nak_delay.
// So the source also remembers, in a small file that survives the
// process, which message it was decoding: a redelivered message is
// written to slot 0 before it is decoded and slot 0 is cleared after. At
// start a non-zero slot 0 names the message the previous process died
// on; it joins a ring of recent suspects. A message is poison when it is
// delivered more than poison_deliveries times AND this collector's
// process died decoding it at least poisonDeaths times: a random kill
// (SIGKILL, the host's OOM killer) can land once on any message being
// decoded in a redelivery burst, and with S3 output healthy messages pass
// poison_deliveries; a message that kills the decoder kills it every time. No fsync: a process death leaves the
// write in the page cache; a host crash is not a poison message.

// poisonDeaths is how many process deaths while decoding one message
// make it a culprit rather than a bystander of a random kill.
const poisonDeaths = 3

// markerSlots is slot 0 (decoding now) plus the ring of recent suspects:
// a handful of distinct poison messages at once is already an attack.
const markerSlots = 1 + 16

// marker is the per-stream decoding marker file.
type marker struct {
	f        *os.File
	suspects map[uint64]int // stream seq → process deaths while decoding it
}

// openMarker opens (creating) dir/<stream>.decoding, moves a non-zero
// slot 0 into the ring and returns the suspects.
func openMarker(dir, stream string) (*marker, uint64, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, 0, fmt.Errorf("poison marker: %w", err)
	}
	path := filepath.Join(dir, stream+".decoding")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, 0, fmt.Errorf("poison marker: %w", err)
	}
	buf := make([]byte, 8*markerSlots)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, 0, fmt.Errorf("poison marker %s: %w", path, err)
	}
	slots := make([]uint64, markerSlots)
	for i := range slots {
		slots[i] = binary.LittleEndian.Uint64(buf[8*i:])
	}
	died := slots[0]
	if died != 0 {
		// Newest first: shift the ring, drop the oldest.
		copy(slots[2:], slots[1:markerSlots-1])
		slots[1], slots[0] = died, 0
		for i, v := range slots {
			binary.LittleEndian.PutUint64(buf[8*i:], v)
		}
		if _, err := f.WriteAt(buf, 0); err != nil {
			f.Close()
			return nil, 0, fmt.Errorf("poison marker %s: %w", path, err)
		}
	}
	m := &marker{f: f, suspects: map[uint64]int{}}
	for _, v := range slots[1:] {
		if v != 0 {
			m.suspects[v]++
		}
	}
	return m, died, nil
}

// culprit reports whether the process died decoding seq poisonDeaths
// times or more.
func (m *marker) culprit(seq uint64) bool { return m.suspects[seq] >= poisonDeaths }

// set records that seq (0: none) is being decoded.
func (m *marker) set(seq uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	_, err := m.f.WriteAt(b[:], 0)
	return err
}

func (m *marker) close() error { return m.f.Close() }
