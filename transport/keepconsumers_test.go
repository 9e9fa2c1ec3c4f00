package transport_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

// TestAgentKeepsCollectorConsumerSettings: an agent's EnsureStreams
// (EnsureStreamsKeepConsumers, its config's collector section at
// defaults) creates missing consumers but never resets the collectors'
// ack_wait and max_ack_pending; a collector's EnsureStreams still
// updates them. On 2.9 a consumer create of an existing durable is an
// update, so the agent must look before it creates.
func TestAgentKeepsCollectorConsumerSettings(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) { t.Parallel(); agentKeepsCollectorConsumerSettings(t, k.start(t)) })
	}
}

func agentKeepsCollectorConsumerSettings(t *testing.T, js jetstream.JetStream) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	ackWait := func() (time.Duration, int) {
		t.Helper()
		c, err := js.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable)
		if err != nil {
			t.Fatal(err)
		}
		return c.CachedInfo().Config.AckWait, c.CachedInfo().Config.MaxAckPending
	}
	collector := transport.DefaultConfig()
	collector.Collector = transport.CollectorConsumer{Durable: transport.DefaultDurable, AckWait: 12 * time.Second, MaxAckPending: 77}
	agent := transport.DefaultConfig()

	steps := []struct {
		name    string
		agent   bool // EnsureStreamsKeepConsumers, else EnsureStreams
		cfg     transport.Config
		wantAck time.Duration
		wantMax int
	}{
		{"agent first, on an empty server: creates with its defaults", true, agent, transport.DefaultAckWait, transport.DefaultMaxAckPending},
		{"collector updates", false, collector, 12 * time.Second, 77},
		{"agent restart keeps the collector's settings", true, agent, 12 * time.Second, 77},
		{"agent again", true, agent, 12 * time.Second, 77},
	}
	for _, st := range steps {
		ensure := transport.EnsureStreams
		if st.agent {
			ensure = transport.EnsureStreamsKeepConsumers
		}
		if err := ensure(ctx, js, st.cfg, log); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if a, m := ackWait(); a != st.wantAck || m != st.wantMax {
			t.Fatalf("%s: consumer ack_wait %s max_ack_pending %d, want %s %d", st.name, a, m, st.wantAck, st.wantMax)
		}
	}
}
