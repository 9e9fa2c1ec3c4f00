// Package spool is the agent's bounded on-disk queue of encoded batches:
// when NATS is unreachable or slow the publisher appends batches here and a
// replayer publishes them, oldest first, once JetStream answers again.
//
// Layout of a spool directory:
//
//	DIR/lock                     held (flock) by the agent that owns DIR
//	DIR/cursor                   "<segment> <offset>": the next entry to replay
//	DIR/<20-digit id>.seg        segments, appended in id order
//
// A segment starts with the 8-byte header "TFSPOOL\x01" followed by frames:
//
//	magic   uint32 LE  0x31534654 ("TFS1")
//	length  uint32 LE  payload bytes (≤ MaxFrame)
//	crc     uint32 LE  CRC-32C (Castagnoli) of the payload
//	payload            version(1) batch_seq(8) created_µs(8) records(4)
//	                   len(2) msg_id  len(2) subject  body (rest)
//
// Guarantees:
//   - Bounded: the segments never exceed Config.MaxBytes; an entry that does
//     not fit is refused with ErrFull and counted as lost by the caller —
//     the spool never blocks or crashes its writer.
//   - Order: entries are replayed in append order.
//   - Crash safety: a torn last frame (kill -9 or power loss mid-append) is
//     truncated at Open and counted; a corrupt frame elsewhere is skipped by
//     scanning forward to the next valid frame, and the skipped bytes are
//     counted. Entries are fsynced at most SyncInterval after they were
//     appended and whenever a segment is sealed.
//   - Memory: one frame at a time is read; nothing loads a segment whole.
//   - Replay is at-least-once: the cursor is persisted after each publish
//     acknowledgement without fsync, so after a crash a few entries may be
//     published again with their original Nats-Msg-Id; JetStream's dedupe
//     window and the collector's committed-batch index absorb them.
//
// Inspect, Verify and Repair back `tapflow spool inspect|verify|repair DIR`.
package spool
