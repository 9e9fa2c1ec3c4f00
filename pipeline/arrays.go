package pipeline

// Arrays recycles the record arrays of acked batches. A full flow batch's
// array is 16384 × 456 B = 7.5 MB; allocating (and zeroing) one per batch
// was most of an agent's garbage and of its collection cost (issue 24).
// A batch's ack ends its life (Batch), so the array a source made for it
// is free again once the batch is acked: the enrich stage copies what it
// holds, and the publisher has encoded or spooled it. The free list is
// bounded: arrays beyond it are left to the garbage collector.
type Arrays[T any] struct{ free chan []T }

// FreeArrays is the default bound on idle arrays: in steady state one
// batch is filled while the one before it is published.
const FreeArrays = 2

// NewArrays keeps up to keep idle arrays.
func NewArrays[T any](keep int) *Arrays[T] { return &Arrays[T]{free: make(chan []T, keep)} }

// Get returns n records, not zeroed: the caller overwrites each record
// before anything reads it (zeroing it there, while its cache lines are
// written anyway, costs what make's zeroing did, without the garbage).
func (p *Arrays[T]) Get(n int) []T {
	select {
	case f := <-p.free:
		if cap(f) >= n {
			return f[:n]
		}
	default:
	}
	return make([]T, n)
}

// Put gives back an array whose batch was acked. Its records keep what
// they point to until the array is reused.
func (p *Arrays[T]) Put(f []T) {
	select {
	case p.free <- f[:0]:
	default:
	}
}

// Idle is the number of arrays kept.
func (p *Arrays[T]) Idle() int { return len(p.free) }
