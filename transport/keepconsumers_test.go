package transport_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/units"
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

// TestAgentKeepsStreamSettings: an agent (EnsureStreamsKeepConsumers)
// whose nats section differs from the collectors' (replicas 3 on a single
// server, other max_bytes and duplicate window) never changes an
// existing stream: it starts without error, every stream keeps the
// collector's settings, and its publishes land. A stream left detached
// by an interrupted creation gets its subjects with the settings it was
// created with, not the agent's.
func TestAgentKeepsStreamSettings(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) { t.Parallel(); agentKeepsStreamSettings(t, k.start(t)) })
	}
}

func agentKeepsStreamSettings(t *testing.T, js jetstream.JetStream) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	collector := transport.DefaultConfig()
	collector.StreamMaxBytes, collector.MetersStreamMaxBytes = 64<<20, 32<<20
	collector.DuplicateWindow = units.Duration(3 * time.Minute)
	agent := transport.DefaultConfig()
	agent.Replicas, agent.StreamMaxBytes, agent.MetersStreamMaxBytes = 3, 1<<30, 1<<30
	agent.DuplicateWindow = units.Duration(time.Minute)

	type settings struct {
		replicas int
		maxBytes int64
		dup      time.Duration
		subjects string
	}
	get := func(name string) settings {
		t.Helper()
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		return settings{c.Replicas, c.MaxBytes, c.Duplicates, strings.Join(c.Subjects, ",")}
	}
	if err := transport.EnsureStreams(ctx, js, collector, log); err != nil {
		t.Fatal(err)
	}
	want := map[string]settings{}
	for _, name := range []string{transport.FlowsStream, transport.MetersStream, transport.DLQStream} {
		want[name] = get(name)
	}
	if want[transport.FlowsStream].maxBytes != 64<<20 || want[transport.MetersStream].maxBytes != 32<<20 || want[transport.FlowsStream].dup != 3*time.Minute {
		t.Fatalf("the collector's EnsureStreams did not apply its settings: %+v", want)
	}
	for i := range 2 { // an agent restart too
		if err := transport.EnsureStreamsKeepConsumers(ctx, js, agent, log); err != nil {
			t.Fatalf("agent start %d: %v", i+1, err)
		}
		for name, w := range want {
			if got := get(name); got != w {
				t.Errorf("agent start %d changed %s: %+v, want %+v", i+1, name, got, w)
			}
		}
	}
	if _, err := js.Publish(ctx, transport.FlowsSubject("n1"), []byte("x"), jetstream.WithMsgID("n1-1")); err != nil {
		t.Fatalf("agent publish: %v", err)
	}
	if _, err := js.Publish(ctx, transport.MetersSubject("n1"), []byte("x"), jetstream.WithMsgID("n1-1")); err != nil {
		t.Fatalf("agent publish: %v", err)
	}

	// A creation interrupted after the detached create: the agent gives
	// the stream its subjects and keeps the settings it was created with.
	if err := js.DeleteStream(ctx, transport.MetersStream); err != nil {
		t.Fatal(err)
	}
	sc := transport.StreamConfigs(collector)[1]
	if sc.Name != transport.MetersStream {
		t.Fatalf("StreamConfigs()[1] is %s", sc.Name)
	}
	detachedSubjects := strings.TrimSuffix(sc.Subjects[0], ">") + "~setup"
	sc.Subjects = []string{detachedSubjects}
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if err := transport.EnsureStreamsKeepConsumers(ctx, js, agent, log); err != nil {
		t.Fatalf("agent on a detached stream: %v", err)
	}
	if got, w := get(transport.MetersStream), want[transport.MetersStream]; got != w {
		t.Errorf("agent on a detached %s: %+v, want %+v", transport.MetersStream, got, w)
	}
	if _, err := js.Publish(ctx, transport.MetersSubject("n1"), []byte("x"), jetstream.WithMsgID("n1-2")); err != nil {
		t.Fatalf("agent publish after attaching: %v", err)
	}
}
