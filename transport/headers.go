package transport

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// Batch headers: the publisher sets them on every flow and meter message
// (next to Nats-Msg-Id), so a subscriber knows what a body holds before
// decoding it. They are the subscriber contract (docs/subscribers.md);
// never rename them.
const (
	// HeaderSchema is the record schema and its major version: flow.v1 or
	// meter.v1 (the tapflow.schema Arrow metadata carries the same).
	HeaderSchema = "Tapflow-Schema"
	// HeaderCodec is the body's wire codec: zstd (an Arrow IPC stream in
	// one zstd frame), arrow-zstd or lz4 (Arrow IPC with the spec's buffer
	// compression), none (plain Arrow IPC).
	HeaderCodec = "Tapflow-Codec"
	// HeaderRecords is the number of records in the batch.
	HeaderRecords = "Tapflow-Records"
	// HeaderAgent and HeaderBatchSeq are the batch identity, the parts of
	// Nats-Msg-Id (<agent_id>-<batch_seq>) and of every record's
	// (agent_id, batch_seq, record_index).
	HeaderAgent    = "Tapflow-Agent"
	HeaderBatchSeq = "Tapflow-Batch-Seq"
)

// BatchHeader returns the headers of one batch message; Nats-Msg-Id is
// set by the publish call.
func BatchHeader(schema, codec, agentID string, seq int64, records int) nats.Header {
	return nats.Header{
		HeaderSchema:   {schema},
		HeaderCodec:    {codec},
		HeaderRecords:  {strconv.Itoa(records)},
		HeaderAgent:    {agentID},
		HeaderBatchSeq: {strconv.FormatInt(seq, 10)},
	}
}
