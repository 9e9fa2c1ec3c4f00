package publish

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tapflow/tapflow/internal/fsx"
)

// seqAllocator hands out batch sequence numbers that never repeat for an
// agent, across restarts: Nats-Msg-Id = <agent_id>-<batch_seq> is deduped by
// JetStream, so a reused number inside the dedupe window would silently
// drop a new batch. It reserves blocks in a file (fsynced before use) and
// starts above both the reservation and the wall clock in µs, so a lost or
// fresh state directory still cannot collide with recent numbers.
type seqAllocator struct {
	path     string
	next     int64
	reserved int64
}

const seqBlock = 1 << 16

// newSeqAllocatorFile keeps its reservation in dir/name: one file per
// sequence (flow batches, meter batches).
func newSeqAllocatorFile(dir, name string) (*seqAllocator, error) {
	if err := fsx.MkdirAll(dir, fsx.PrivateDir, fsx.NoGroup); err != nil {
		return nil, fmt.Errorf("batch sequence: create %s: %w", dir, err)
	}
	a := &seqAllocator{path: filepath.Join(dir, name)}
	start := time.Now().UnixMicro()
	if b, err := os.ReadFile(a.path); err == nil {
		v, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			return nil, fmt.Errorf("batch sequence: %s holds %q, not a number; delete it (the agent restarts above the clock)", a.path, b)
		}
		if v < 0 || v > 1<<62 {
			// near the top, the next block's reservation would wrap negative
			return nil, fmt.Errorf("batch sequence: %s holds %d, outside [0, 2^62]; delete it (the agent restarts above the clock)", a.path, v)
		}
		start = max(start, v)
	} else if !os.IsNotExist(err) {
		return nil, fmt.Errorf("batch sequence: read %s: %w", a.path, err)
	}
	a.next, a.reserved = start, start
	return a, nil
}

// Next returns the next sequence, reserving a new block first if needed.
func (a *seqAllocator) Next() (int64, error) {
	if a.next >= a.reserved {
		if err := a.reserve(a.next + seqBlock); err != nil {
			return 0, err
		}
	}
	v := a.next
	a.next++
	return v, nil
}

// Skip jumps the next sequence ahead by 2^20 to 2^21 (random), reserving
// past it: ids another publisher burned in advance are passed over.
func (a *seqAllocator) Skip() error {
	a.next += 1<<20 + rand.Int64N(1<<20)
	if a.next >= a.reserved {
		return a.reserve(a.next + seqBlock)
	}
	return nil
}

func (a *seqAllocator) reserve(upTo int64) error {
	tmp := a.path + ".tmp"
	f, err := fsx.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fsx.PrivateFile, fsx.NoGroup)
	if err != nil {
		return fmt.Errorf("batch sequence: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d\n", upTo)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, a.path)
	}
	if err != nil {
		return fmt.Errorf("batch sequence: persist %s: %w", a.path, err)
	}
	a.reserved = upTo
	return nil
}
