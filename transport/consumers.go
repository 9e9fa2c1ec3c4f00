package transport

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport/names"
)

// Collector consumer defaults (the `collector:` section's durable,
// ack_wait and max_ack_pending).
const (
	DefaultDurable       = names.DefaultDurable
	MetersDurableSuffix  = names.MetersDurableSuffix // the meters consumer is "<durable>-meters"
	DefaultAckWait       = 7 * time.Minute
	DefaultMaxAckPending = 20000
)

// CollectorConsumer is what the collector's durable consumers are made
// of. The collector (transport/consume) and EnsureStreams build them with
// the same function, CollectorConsumerConfig, so they never diverge.
type CollectorConsumer struct {
	Durable       string        // flows consumer name; meters use Durable + MetersDurableSuffix
	AckWait       time.Duration // resolved ack_wait
	MaxAckPending int
}

// DefaultCollectorConsumer is the collector's consumer at default config.
func DefaultCollectorConsumer() CollectorConsumer {
	return CollectorConsumer{Durable: DefaultDurable, AckWait: DefaultAckWait, MaxAckPending: DefaultMaxAckPending}
}

// CollectorConsumerConfig is the collector's durable pull consumer named
// durable reading filter: explicit acks (sent after the Parquet commit),
// every message from the start of the stream. No MaxDeliver: past it
// JetStream never delivers a message again and, in an interest stream,
// keeps it unacked for good, silently; a message the collector dies on is
// dead-lettered by its poison detection instead (transport/consume).
func CollectorConsumerConfig(durable, filter string, ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   "tapflow collector: Parquet writer, acks after file commit",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: maxAckPending,
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// CollectorConsumerConfigs are the collector's consumers by stream (flows
// and meters); zero fields of c take the defaults.
func CollectorConsumerConfigs(c CollectorConsumer) map[string]*jetstream.ConsumerConfig {
	d := DefaultCollectorConsumer()
	if c.Durable == "" {
		c.Durable = d.Durable
	}
	if c.AckWait <= 0 {
		c.AckWait = d.AckWait
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = d.MaxAckPending
	}
	flows := CollectorConsumerConfig(c.Durable, FlowsSubjectRoot+".>", c.AckWait, c.MaxAckPending)
	meters := CollectorConsumerConfig(c.Durable+MetersDurableSuffix, MetersSubjectRoot+".>", c.AckWait, c.MaxAckPending)
	return map[string]*jetstream.ConsumerConfig{FlowsStream: &flows, MetersStream: &meters}
}

// DefaultSubscriberInactive is a suggested InactiveThreshold for
// SubscriberConsumer: long enough to ride out a restart or a deploy,
// short enough that a subscriber that is gone for good stops pinning the
// backlog within the hour.
const DefaultSubscriberInactive = time.Hour

// SubscriberConsumer is the durable consumer an analytics (or any other)
// subscriber attaches to TAPFLOW_FLOWS (or TAPFLOW_METERS) with, next to
// the collector's: it sees every message the collector sees without
// taking any from it. Streams use interest retention, so a message stays
// until the collector and every subscriber have acked it; the server
// deletes the consumer once nobody has pulled from it for inactive (0:
// DefaultSubscriberInactive), so a subscriber that goes away pins the
// stream for at most that long after its last pull, or after the ack wait
// (1m here) of its last unacked message when that is later. New messages only (DeliverNew): the
// backlog the collector has not acked yet is not replayed. Set
// FilterSubject (e.g. FlowsSubject(node)) to read part of the stream;
// the stream then keeps only what some consumer still wants.
//
//	cfg := transport.SubscriberConsumer("analytics", time.Hour)
//	cons, err := js.CreateOrUpdateConsumer(ctx, transport.FlowsStream, cfg)
//	// cons.Consume / cons.Fetch, then msg.Ack() each message
func SubscriberConsumer(name string, inactive time.Duration) jetstream.ConsumerConfig {
	if inactive <= 0 {
		inactive = DefaultSubscriberInactive
	}
	return jetstream.ConsumerConfig{
		Durable:           name,
		Description:       "subscriber " + name + ": deleted by the server after " + inactive.String() + " without a pull",
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           time.Minute,
		MaxAckPending:     1000,
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		InactiveThreshold: inactive,
	}
}
