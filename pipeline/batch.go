package pipeline

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tapflow/tapflow/schemas"
)

// AckFunc ends a batch's life: err == nil means its records are durable
// downstream; otherwise the producer should retry or account for the loss.
type AckFunc func(err error)

// Batch is the unit that moves between the stages of a flow pipeline.
type Batch = BatchOf[schemas.Flow]

// BatchOf is the unit that moves between stages, for any record type
// (schemas.Flow, schemas.Meter).
type BatchOf[T any] struct {
	// Records are the records; stages may modify them in place.
	Records []T
	// Seq identifies the batch to its producer: the agent batch sequence on
	// the agent, the JetStream stream sequence in the collector.
	Seq int64
	// Created is when the batch was formed, for latency and age metrics.
	Created time.Time

	ack   AckFunc
	acked atomic.Bool
}

// NewBatch returns a flow batch whose Ack calls ack (which may be nil).
func NewBatch(records []schemas.Flow, ack AckFunc) *Batch {
	return NewBatchOf(records, ack)
}

// NewBatchOf returns a batch of any record type whose Ack calls ack (which
// may be nil).
func NewBatchOf[T any](records []T, ack AckFunc) *BatchOf[T] {
	return &BatchOf[T]{Records: records, Created: time.Now(), ack: ack}
}

// Ack ends the batch's life. It must be called exactly once.
func (b *BatchOf[T]) Ack(err error) {
	if !b.acked.CompareAndSwap(false, true) {
		panic(fmt.Sprintf("pipeline: batch seq=%d acked twice", b.Seq))
	}
	if b.ack != nil {
		b.ack(err)
	}
}

// Acked reports whether Ack has been called.
func (b *BatchOf[T]) Acked() bool { return b.acked.Load() }

// wrapAck runs hook before the batch's own ack; the runner uses it to count
// sink outcomes without the sink knowing.
func (b *BatchOf[T]) wrapAck(hook func(n int, err error)) {
	inner, n := b.ack, len(b.Records)
	b.ack = func(err error) {
		hook(n, err)
		if inner != nil {
			inner(err)
		}
	}
}

// AckGroup is an AckGroupOf flow batches.
type AckGroup = AckGroupOf[schemas.Flow]

// AckGroupOf joins the acks of several batches (e.g. the messages folded
// into one Parquet file) and fires them together. The zero value is ready.
type AckGroupOf[T any] struct {
	mu      sync.Mutex
	batches []*BatchOf[T]
	records int
}

// Add takes ownership of b's ack.
func (g *AckGroupOf[T]) Add(b *BatchOf[T]) {
	g.mu.Lock()
	g.batches = append(g.batches, b)
	g.records += len(b.Records)
	g.mu.Unlock()
}

// Len returns the number of batches and records held.
func (g *AckGroupOf[T]) Len() (batches, records int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.batches), g.records
}

// Ack acks every batch held with err and empties the group.
func (g *AckGroupOf[T]) Ack(err error) {
	g.mu.Lock()
	bs := g.batches
	g.batches, g.records = nil, 0
	g.mu.Unlock()
	for _, b := range bs {
		b.Ack(err)
	}
}
