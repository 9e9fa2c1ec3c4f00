package config

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// WireBytesPerRecord is a flow record's measured size on the wire per
// codec (docs/subscribers.md, BenchmarkWireCodec): what `tapflow
// validate` converts a stream's byte rate into records with.
var WireBytesPerRecord = map[string]float64{
	schemas.CodecLZ4:       54.5,
	schemas.CodecZstd:      32.1,
	schemas.CodecArrowZstd: 36.3,
	schemas.CodecNone:      178.2,
}

// meterWireBytes is a meter record's size on the wire (≈100 B, see
// transport.MetersMaxBytes).
const meterWireBytes = 100

// StreamRate is the sustained rate a stream carries with files that roll
// by roll_size or roll_age: above it the collectors commit early (smaller
// files, nothing refused); the collectors' CPU and disk bound the rest.
type StreamRate struct {
	Stream string
	// The settings it follows from.
	RollAge       time.Duration
	Share         float64
	MaxBytes      units.ByteSize
	MaxAckPending int
	Codec         string // flows only
	// Held is what the collectors may hold unacked before they commit
	// early: early_commit_share × the stream's max_bytes.
	Held int64
	// BytesPerSecond is Held / roll_age.
	BytesPerSecond float64
	// RecordsPerSecond is BytesPerSecond at WireBytesPerRecord.
	RecordsPerSecond float64
	// BytesPerRecord is the wire size used.
	BytesPerRecord float64
	// MessagesPerSecond is early_commit_share × max_ack_pending / roll_age:
	// agent batches per second before max_ack_pending commits early.
	MessagesPerSecond float64
}

// StreamRates returns the rate each stream carries with the
// configuration's stream sizes, roll_age, early_commit_share and
// max_ack_pending.
func (c Config) StreamRates() []StreamRate {
	age := c.Collector.Parquet.RollAge.D().Seconds()
	share := c.Collector.Consumer.EarlyCommitShare
	if age <= 0 || share <= 0 {
		return nil
	}
	msgs := share * float64(c.Collector.Consumer.MaxAckPending) / age
	out := make([]StreamRate, 0, 2)
	for _, s := range []struct {
		name  string
		max   units.ByteSize
		bpr   float64
		codec string
	}{
		{transport.FlowsStream, c.NATS.StreamMaxBytes, WireBytesPerRecord[c.NATS.Codec], c.NATS.Codec},
		{transport.MetersStream, c.NATS.MetersStreamMaxBytes, meterWireBytes, ""},
	} {
		r := StreamRate{Stream: s.name, RollAge: c.Collector.Parquet.RollAge.D(), Share: share, MaxBytes: s.max, MaxAckPending: c.Collector.Consumer.MaxAckPending,
			Codec: s.codec, Held: int64(share * float64(s.max)), BytesPerRecord: s.bpr, MessagesPerSecond: msgs}
		r.BytesPerSecond = float64(r.Held) / age
		if s.bpr > 0 {
			r.RecordsPerSecond = r.BytesPerSecond / s.bpr
		}
		out = append(out, r)
	}
	return out
}

// String is the line `tapflow validate` prints.
func (r StreamRate) String() string {
	recs := ""
	if r.RecordsPerSecond > 0 {
		recs = fmt.Sprintf(" ≈ %.0f records/s at %.1f B/record", r.RecordsPerSecond, r.BytesPerRecord)
		if r.Codec != "" {
			recs += " (" + r.Codec + ")"
		}
	}
	return fmt.Sprintf("%s: files roll by roll_age %s up to %.1f MB/s of the fleet's publishes%s and %.0f agent batches/s "+
		"(early_commit_share %g × max_bytes %s, × max_ack_pending %d, over roll_age); above that the collectors commit early: smaller files, no publish refused",
		r.Stream, units.Duration(r.RollAge), r.BytesPerSecond/1e6, recs, r.MessagesPerSecond, r.Share, r.MaxBytes, r.MaxAckPending)
}
