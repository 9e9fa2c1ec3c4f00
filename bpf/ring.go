//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Ring reads the records ring buffer without consuming it: Read moves a
// private read position, and the kernel's consumer position moves only
// when Commit is called — once the records up to there are durable
// downstream. The consumer position lives in the map, so a pinned ring
// handed to a restarted agent (even after a SIGKILL) is read again from
// the last commit: records read but not yet durable are not lost.
//
// (cilium/ebpf's ringbuf.Reader consumes each record as it reads it.)
// Without epoll and deadlines it is also cheaper per record: BenchmarkDrain
// 55.8–61.2 ns/record against 88.7–93.5 with ringbuf.Reader, measured in
// the same session (2 CPUs, load average 38).
type Ring struct {
	cons, data []byte // mmaps: consumer page (rw), producer page + data twice (ro)
	consPos    *uintptr
	prodPos    *uintptr
	ring       []byte
	mask       uintptr
	read       uintptr // next position to read; ≥ *consPos

	mu     sync.Mutex // Commit vs Close
	closed bool
}

// Ring buffer header bits, as in linux/bpf.h.
const (
	ringHdrSize    = 8
	ringBusyBit    = 1 << 31
	ringDiscardBit = 1 << 30
)

// OpenRing maps the ring buffer m. Reading starts at its consumer
// position.
func OpenRing(m *ebpf.Map) (*Ring, error) {
	if m.Type() != ebpf.RingBuf {
		return nil, fmt.Errorf("open ring: map type %s is not a ring buffer", m.Type())
	}
	size := int(m.MaxEntries())
	page := os.Getpagesize()
	cons, err := unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap ring consumer page: %w", explain(err))
	}
	data, err := unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(cons)
		return nil, fmt.Errorf("mmap ring data: %w", explain(err))
	}
	r := &Ring{
		cons: cons, data: data,
		consPos: (*uintptr)(unsafe.Pointer(&cons[0])),
		prodPos: (*uintptr)(unsafe.Pointer(&data[0])),
		ring:    data[page:],
		mask:    uintptr(size - 1),
	}
	r.read = atomic.LoadUintptr(r.consPos)
	return r, nil
}

// Unread is how many bytes the producer wrote past the read position.
func (r *Ring) Unread() uint64 {
	return uint64(atomic.LoadUintptr(r.prodPos) - r.read)
}

// Uncommitted is how many bytes were read but not committed.
func (r *Ring) Uncommitted() uint64 {
	return uint64(r.read - atomic.LoadUintptr(r.consPos))
}

// Pos is the read position, to Commit once what was read is durable.
func (r *Ring) Pos() uint64 { return uint64(r.read) }

// errRingCorrupt: a header points past what the producer wrote.
var errRingCorrupt = errors.New("ring buffer header beyond the producer position")

// Read copies the next record into buf (grown as needed) and returns it;
// ok is false when there is none (or the next is still being written).
func (r *Ring) Read(buf []byte) (sample []byte, ok bool, err error) {
	prod := atomic.LoadUintptr(r.prodPos)
	for {
		if prod-r.read < ringHdrSize {
			return buf[:0], false, nil
		}
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.ring[r.read&r.mask])))
		if hdr&ringBusyBit != 0 {
			return buf[:0], false, nil
		}
		n := uintptr(hdr &^ (ringBusyBit | ringDiscardBit))
		start := r.read + ringHdrSize
		next := start + (n+7)&^7
		if next-r.read > prod-r.read {
			return buf[:0], false, errRingCorrupt
		}
		r.read = next
		if hdr&ringDiscardBit != 0 {
			continue
		}
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		copy(buf, r.ring[start&r.mask:]) // the data pages are mapped twice: no wrap
		return buf, true, nil
	}
}

// Commit gives the ring space up to pos (a Pos value) back to the kernel.
// Safe for concurrent use; a no-op after Close or for an older pos.
func (r *Ring) Commit(pos uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if cur := atomic.LoadUintptr(r.consPos); int64(uintptr(pos)-cur) > 0 {
		atomic.StoreUintptr(r.consPos, uintptr(pos))
	}
}

// Close unmaps the ring. Uncommitted records stay in it.
func (r *Ring) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	return errors.Join(unix.Munmap(r.cons), unix.Munmap(r.data))
}
