package pipeline

import (
	"context"

	"github.com/tapflow/tapflow/schemas"
)

// Source is a SourceOf flow records.
type Source = SourceOf[schemas.Flow]

// Transform is a TransformOf flow records.
type Transform = TransformOf[schemas.Flow]

// Sink is a SinkOf flow records.
type Sink = SinkOf[schemas.Flow]

// Holder is a HolderOf flow records.
type Holder = HolderOf[schemas.Flow]

// SourceOf produces batches of T.
//
// Run sends batches to out until ctx is cancelled, then sends what it still
// holds (blocking on a full edge is backpressure) and returns nil. It never
// closes out: the runner does. A returned error stops the whole pipeline.
type SourceOf[T any] interface {
	Name() string
	Run(ctx context.Context, out chan<- *BatchOf[T]) error
}

// TransformOf changes batches in place (e.g. attribution).
//
// Apply is called from one goroutine. An error ends the batch: the runner
// acks it with the error and counts it; the pipeline keeps running.
type TransformOf[T any] interface {
	Name() string
	Apply(ctx context.Context, b *BatchOf[T]) error
}

// SinkOf consumes batches and acks each once its records are durable.
//
// Run reads in until it is closed, makes pending data durable, acks, and
// returns nil. ctx is cancelled only on hard stop or when another stage
// failed; then Run returns promptly, acking what it could not commit with
// an error. A returned error stops the whole pipeline.
type SinkOf[T any] interface {
	Name() string
	Run(ctx context.Context, in <-chan *BatchOf[T]) error
}

// TransformFunc adapts a function to Transform.
type TransformFunc struct {
	StageName string
	Fn        func(ctx context.Context, b *Batch) error
}

// Name implements Transform.
func (t TransformFunc) Name() string { return t.StageName }

// Apply implements Transform.
func (t TransformFunc) Apply(ctx context.Context, b *Batch) error { return t.Fn(ctx, b) }

// HolderOf is implemented by transforms that keep records across batches
// (late binding). Once the transform's input is closed the runner calls
// Flush and sends what it returns downstream as one last batch, so a
// graceful stop loses none of them.
type HolderOf[T any] interface {
	Flush() []T
}
