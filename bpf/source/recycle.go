package source

import "github.com/tapflow/tapflow/schemas"

// flowArrays recycles the record arrays of acked batches. A full batch's
// array is 16384 × 456 B = 7.5 MB; allocating (and zeroing) one per batch
// was most of the agent's garbage and of its collection cost (issue 24).
// A batch's ack ends its life (pipeline.Batch), so the array the source
// made for it is free again once the batch is acked: the enrich stage
// copies what it holds, and the publisher has encoded or spooled it.
// The free list is bounded: arrays beyond it are left to the collector.
type flowArrays struct{ free chan []schemas.Flow }

// freeFlowArrays bounds the arrays kept idle: in steady state one batch is
// decoded while the one before it is published.
const freeFlowArrays = 2

func newFlowArrays() *flowArrays { return &flowArrays{free: make(chan []schemas.Flow, freeFlowArrays)} }

// get returns n records, not zeroed: the caller resets each record before
// filling it (zeroing it there, while its cache lines are written anyway,
// costs what make's zeroing did, without the garbage).
func (p *flowArrays) get(n int) []schemas.Flow {
	select {
	case f := <-p.free:
		if cap(f) >= n {
			return f[:n]
		}
	default:
	}
	return make([]schemas.Flow, n)
}

// put gives back an array whose batch was acked. Its records keep their
// strings (snapshot and interface names) until the array is reused.
func (p *flowArrays) put(f []schemas.Flow) {
	select {
	case p.free <- f[:0]:
	default:
	}
}
