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

// Batch is the unit that moves between stages.
type Batch struct {
	// Records are the flow records; stages may modify them in place.
	Records []schemas.Flow
	// Seq identifies the batch to its producer: the agent batch sequence on
	// the agent, the JetStream stream sequence in the collector.
	Seq int64
	// Created is when the batch was formed, for latency and age metrics.
	Created time.Time

	ack   AckFunc
	acked atomic.Bool
}

// NewBatch returns a batch whose Ack calls ack (which may be nil).
func NewBatch(records []schemas.Flow, ack AckFunc) *Batch {
	return &Batch{Records: records, Created: time.Now(), ack: ack}
}

// Ack ends the batch's life. It must be called exactly once.
func (b *Batch) Ack(err error) {
	if !b.acked.CompareAndSwap(false, true) {
		panic(fmt.Sprintf("pipeline: batch seq=%d acked twice", b.Seq))
	}
	if b.ack != nil {
		b.ack(err)
	}
}

// Acked reports whether Ack has been called.
func (b *Batch) Acked() bool { return b.acked.Load() }

// wrapAck runs hook before the batch's own ack; the runner uses it to count
// sink outcomes without the sink knowing.
func (b *Batch) wrapAck(hook func(n int, err error)) {
	inner, n := b.ack, len(b.Records)
	b.ack = func(err error) {
		hook(n, err)
		if inner != nil {
			inner(err)
		}
	}
}

// AckGroup joins the acks of several batches (e.g. the messages folded into
// one Parquet file) and fires them together. The zero value is ready.
type AckGroup struct {
	mu      sync.Mutex
	batches []*Batch
	records int
}

// Add takes ownership of b's ack.
func (g *AckGroup) Add(b *Batch) {
	g.mu.Lock()
	g.batches = append(g.batches, b)
	g.records += len(b.Records)
	g.mu.Unlock()
}

// Len returns the number of batches and records held.
func (g *AckGroup) Len() (batches, records int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.batches), g.records
}

// Ack acks every batch held with err and empties the group.
func (g *AckGroup) Ack(err error) {
	g.mu.Lock()
	bs := g.batches
	g.batches, g.records = nil, 0
	g.mu.Unlock()
	for _, b := range bs {
		b.Ack(err)
	}
}
