// Package pipeline is tapflow's stage framework: [Batch]es of flow records
// move from a [Source] through [Transform]s to a [Sink] over bounded
// channels, supervised by a [Runner].
//
// Every type is generic over the record type ([BatchOf], [SourceOf],
// [TransformOf], [SinkOf], [RunnerOf]); the unparameterised names are
// aliases for flow records (schemas.Flow). The agent and the collector run
// a second pipeline of meter records (schemas.Meter) next to the flow one.
//
// Contracts:
//   - Every Batch carries an ack that is called exactly once by whoever ends
//     the batch's life: the sink after its data is durable (nil), or any stage
//     that gives up on it (the error). Calling it twice panics: it is a bug.
//   - Edges are bounded; a full edge blocks the writer (backpressure). The
//     framework never drops a batch.
//   - Shutdown is two-phase: cancelling Run's context stops the source, which
//     flushes what it holds and returns; transforms and the sink drain their
//     inputs, the sink commits, and Run returns. If that takes longer than
//     ShutdownTimeout the sink's context is cancelled too (hard stop).
package pipeline
