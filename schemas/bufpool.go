package schemas

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Recycled decode buffers. A row decoder's Chunks alias the Arrow
// buffers arrow-go decompresses each message into, so those buffers live
// as long as the rows; fresh from the Go heap they were most of what the
// collector allocated per row. With a BufferPool (DecoderOf.WithPool)
// every buffer of one Decode comes from the pool through an arena that
// ignores arrow-go's Free: arrow-go frees a message's buffers when
// Decode releases its reader, while the rows still read them. The arena
// goes back to the pool only when ReleaseRows has released every Chunk
// of the message, which the owner of the rows calls once nothing reads
// them any more (the collector: the Parquet sink after writing them,
// the source after dead-lettering them). A Chunk never released is
// garbage collected with its buffers: forgetting ReleaseRows costs
// allocation, never correctness; releasing early does, which is why the
// pool can poison what it takes back (tests).

// Buffers below minPooled are not worth a free list; above maxPooled
// (beyond any message a limited decoder accepts) they are not kept.
const (
	minPooled = 1 << 10
	maxPooled = 512 << 20
)

// PoisonByte fills every buffer a poisoning pool takes back.
const PoisonByte = 0xDB

// BufferPool recycles the Arrow buffers of decoded messages. It keeps at
// most its cap in idle buffers; what is returned beyond is left to the
// garbage collector and counted (PoolStats.Dropped). Safe for concurrent
// use.
type BufferPool struct {
	max    int64
	poison bool

	mu   sync.Mutex
	free map[int][][]byte // by class size
	rows [][]Row          // row slices of released messages, cleared
	idle int64

	gets, hits, returned, dropped atomic.Uint64
	bytes                         atomic.Uint64 // handed out, in all
	out                           atomic.Int64  // bytes held by live arenas
	arenas                        atomic.Int64  // messages whose rows are not released
}

// NewBufferPool returns a pool keeping at most maxIdle bytes of idle
// buffers (> 0).
func NewBufferPool(maxIdle int64) *BufferPool {
	return &BufferPool{max: max(maxIdle, 0), free: map[int][][]byte{}}
}

// Poisoned makes the pool fill every buffer it takes back with
// PoisonByte, so a row read after its release shows (tests of release
// points); it returns p.
func (p *BufferPool) Poisoned() *BufferPool {
	p.poison = true
	return p
}

// PoolStats are a BufferPool's counters.
type PoolStats struct {
	Gets     uint64 // buffers handed out
	Bytes    uint64 // bytes handed out (their size classes)
	Hits     uint64 // of them, recycled
	Returned uint64 // buffers taken back into the pool
	Dropped  uint64 // buffers given back beyond the cap (left to the GC)
	Idle     int64  // bytes of idle buffers held (≤ Max)
	Max      int64  // the cap on Idle
	Out      int64  // bytes held by messages whose rows are not released
	Messages int64  // messages whose rows are not released
}

// Stats returns the counters.
func (p *BufferPool) Stats() PoolStats {
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	return PoolStats{Gets: p.gets.Load(), Bytes: p.bytes.Load(), Hits: p.hits.Load(), Returned: p.returned.Load(), Dropped: p.dropped.Load(),
		Idle: idle, Max: p.max, Out: p.out.Load(), Messages: p.arenas.Load()}
}

// classSize rounds n up to its size class: four classes per power of
// two, so a buffer wastes at most a fifth of itself; 0 for sizes not
// pooled.
func classSize(n int) int {
	if n < minPooled || n > maxPooled {
		return 0
	}
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return (n + step - 1) &^ (step - 1)
}

// get returns a zeroed buffer of n bytes: its contents must not carry
// another message's bytes into this one.
func (p *BufferPool) get(n int) []byte {
	c := classSize(n)
	if c == 0 {
		return make([]byte, n)
	}
	p.gets.Add(1)
	p.bytes.Add(uint64(c))
	p.mu.Lock()
	if l := p.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[c] = l[:len(l)-1]
		p.idle -= int64(c)
		p.mu.Unlock()
		p.hits.Add(1)
		b = b[:n]
		clear(b)
		return b
	}
	p.mu.Unlock()
	return make([]byte, n, c)
}

// put takes back buffers that nothing reads any more.
func (p *BufferPool) put(bufs [][]byte) {
	if p.poison {
		for _, b := range bufs {
			b = b[:cap(b)]
			for i := range b {
				b[i] = PoisonByte
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range bufs {
		c := cap(b)
		if classSize(c) != c {
			continue // not from get
		}
		if p.idle+int64(c) > p.max {
			p.dropped.Add(1)
			continue
		}
		p.free[c] = append(p.free[c], b[:0])
		p.idle += int64(c)
		p.returned.Add(1)
	}
}

// maxPooledRowSlices bounds the row slices kept: one per message between
// the fetch and the sink is plenty.
const maxPooledRowSlices = 16

const rowSize = int64(unsafe.Sizeof(Row{}))

// getRows returns an empty row slice, recycled if one is idle.
func (p *BufferPool) getRows() []Row {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.rows)
	if n == 0 {
		return nil
	}
	r := p.rows[n-1]
	p.rows[n-1] = nil
	p.rows = p.rows[:n-1]
	p.idle -= int64(cap(r)) * rowSize
	return r
}

// putRows takes back the row slice of a released message.
func (p *BufferPool) putRows(r []Row) {
	r = r[:cap(r)]
	clear(r) // the old Chunks must not stay reachable from the pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.rows) >= maxPooledRowSlices || p.idle+int64(cap(r))*rowSize > p.max {
		p.dropped.Add(1)
		return
	}
	p.rows = append(p.rows, r[:0])
	p.idle += int64(cap(r)) * rowSize
}

// arena is the memory.Allocator of one Decode (or one Encode): every
// buffer arrow-go asks for comes from the pool and stays the arena's until
// the message's Chunks are all released (refs), whatever arrow-go frees
// meanwhile (or until the encoded message is written). Allocation runs on
// the decoding (encoding) goroutine only.
type arena struct {
	pool  *BufferPool
	bufs  [][]byte
	bytes int64
	refs  atomic.Int32 // Chunks not yet released
	// rows is the row slice Decode returned when it came from the pool
	// (the caller passed none): the message's rows are its only
	// contents.
	rows []Row
}

func (p *BufferPool) newArena() *arena {
	p.arenas.Add(1)
	return &arena{pool: p}
}

func (a *arena) Allocate(n int) []byte {
	b := a.pool.get(n)
	if classSize(cap(b)) == cap(b) {
		a.bufs = append(a.bufs, b)
		a.bytes += int64(cap(b))
		a.pool.out.Add(int64(cap(b)))
	}
	return b
}

func (a *arena) Reallocate(n int, b []byte) []byte {
	if n <= cap(b) {
		old := len(b)
		b = b[:n]
		if n > old {
			clear(b[old:])
		}
		return b
	}
	nb := a.Allocate(n)
	copy(nb, b)
	return nb // b stays the arena's until the release: arrow-go may still hold a slice of it
}

// Free is a no-op: arrow-go frees a message's buffers when Decode
// releases its reader, while the rows still alias them.
func (a *arena) Free([]byte) {}

// adopt makes the arena c's; it is freed once every Chunk adopted is
// released.
func (a *arena) adopt(c *Chunk) {
	if c.arena == nil {
		c.arena = a
		a.refs.Add(1)
	}
}

// free gives the arena's buffers back to the pool. Called once, when
// nothing reads them any more.
func (a *arena) free() {
	a.pool.out.Add(-a.bytes)
	a.pool.arenas.Add(-1)
	bufs, rows := a.bufs, a.rows
	a.bufs, a.bytes, a.rows = nil, 0, nil
	a.pool.put(bufs)
	if rows != nil {
		a.pool.putRows(rows)
	}
}

// adoptRows gives the arena to the Chunks of rows (one Decode's), or
// frees it when there are none.
func (a *arena) adoptRows(rows []Row) {
	var last *Chunk
	for _, r := range rows {
		if r.c != last {
			a.adopt(r.c)
			last = r.c
		}
	}
	if a.refs.Load() == 0 {
		a.free()
	}
}

// ReleaseRows declares that nothing will read rows, nor any other row of
// the messages they were decoded from, any more: the buffers of a
// message decoded by a pooling decoder go back to its pool once every
// Chunk of it is released. rows may be sorted or a mix of messages;
// releasing a Chunk again is a no-op. Rows of decoders without a pool
// are untouched. The caller must own every row of those messages: a copy
// of a Row kept elsewhere would read recycled memory.
func ReleaseRows(rows []Row) {
	// Chunks first, released after: the last release recycles the row
	// slice itself when the pool lent it.
	var few [4]*Chunk
	cs := few[:0]
	var last *Chunk
	for _, r := range rows {
		if r.c != last && r.c != nil && !slices.Contains(cs, r.c) {
			cs = append(cs, r.c)
		}
		last = r.c
	}
	for _, c := range cs {
		c.release()
	}
}

func (c *Chunk) release() {
	if c == nil || c.arena == nil || !c.released.CompareAndSwap(false, true) {
		return
	}
	if c.arena.refs.Add(-1) == 0 {
		c.arena.free()
	}
}
