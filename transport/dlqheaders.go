package transport

// Dead-letter headers beyond HeaderOrigSubject, HeaderOrigSeq and
// HeaderError: the collector sets them on every message it moves to
// TAPFLOW_DLQ, `tapflow dlq` reads them.
const (
	// HeaderReason is the machine-readable class of the rejection:
	// poison, decode, size, identity or time (consume.Reasons).
	HeaderReason = "Tapflow-Reason"
	// HeaderOrigMsgID keeps the original Nats-Msg-Id (<agent_id>-<batch_seq>):
	// the dead letter itself carries a DLQ message id, and a replay
	// republishes with the original one so JetStream dedupes it.
	HeaderOrigMsgID = "Tapflow-Original-Msg-Id"
	// HeaderOrigStream names the stream the message came from.
	HeaderOrigStream = "Tapflow-Original-Stream"
)
