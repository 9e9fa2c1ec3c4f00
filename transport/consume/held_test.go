package consume_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/publish"
)

// TestHeldMessagePayloadIsReleased: a collector holds every message of an
// open file until the file commits (minutes), but once its records are
// decoded (and, in the Parquet sink, written and dropped) the payload must
// not stay in memory: 48 held messages of ~1 MiB each may not keep 48 MiB
// alive. Holding the jetstream.Msg until the ack did exactly that.
func TestHeldMessagePayloadIsReleased(t *testing.T) {
	const (
		messages   = 48
		perMessage = 4000 // ~1 MiB each with codec none
	)
	s := transporttest.Run(t, "")
	// A memory stream: the server's share of the heap is then the stored
	// messages, constant until they are acked, so the heap's growth is
	// what the collector side keeps (a file stream's block cache loads
	// and expires under the measurement).
	ctx0 := context.Background()
	if err := s.JS.DeleteStream(ctx0, transport.FlowsStream); err != nil {
		t.Fatal(err)
	}
	sc := transport.StreamConfigs(transport.DefaultConfig())[0]
	sc.Storage, sc.Retention, sc.MaxBytes = jetstream.MemoryStorage, jetstream.LimitsPolicy, 256<<20
	if _, err := s.JS.CreateStream(ctx0, sc); err != nil {
		t.Fatal(err)
	}
	ncfg := transport.DefaultConfig()
	ncfg.Codec = "none"
	pub, err := publish.New(s.JS, publish.Options{AgentID: "cmp1", Node: "cmp1", StateDir: t.TempDir(), NATS: ncfg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch, messages)
	var wg sync.WaitGroup
	for i := range messages {
		recs := make([]schemas.Flow, perMessage)
		for j := range recs {
			recs[j] = schemas.Flow{Bytes: int64(j), Packets: 1, TenantID: fmt.Sprintf("tenant-%08d-%08d", i, j), ServerID: fmt.Sprintf("server-%08d-%08d-padding-padding", i, j),
				PortID: fmt.Sprintf("port-%08d-%08d-padding-padding", i, j), Direction: "tx", Node: "cmp1", TimeEnd: time.Now().UnixMicro()}
		}
		wg.Add(1)
		in <- pipeline.NewBatch(recs, func(err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("publish: %v", err)
			}
		})
	}
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	st, err := s.JS.Stream(context.Background(), transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	payload := info.State.Bytes
	if payload < 32<<20 {
		t.Fatalf("stream holds %d bytes; the test needs ≥ 32 MiB of payload to tell held from released", payload)
	}

	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(time.Minute)
	src, err := consume.New(s.JS, cfg, consume.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *pipeline.Batch, 4)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	var held []*pipeline.Batch
	deadline := time.After(2 * time.Minute)
	for len(held) < messages {
		select {
		case b := <-out:
			b.Records = nil // what the Parquet sink does once a batch is written
			held = append(held, b)
		case <-deadline:
			t.Fatalf("got %d of %d messages", len(held), messages)
		}
	}
	grown := int64(heap()) - int64(before)
	t.Logf("%d messages (%d MiB in the stream) held unacked: heap grew %.1f MiB", len(held), payload>>20, float64(grown)/(1<<20))
	if grown > int64(payload)/4 {
		t.Errorf("heap grew %d MiB while holding %d acked-later messages of %d MiB total: payloads are kept until the ack", grown>>20, len(held), payload>>20)
	}
	for _, b := range held {
		b.Ack(nil)
	}
	_ = stopSource(cancel, out, done, nil)
	c, err := s.JS.Consumer(context.Background(), transport.FlowsStream, cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	// Acks are asynchronous publishes: poll until the server has them all.
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		ci, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumAckPending == 0 && ci.NumPending == 0 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("ack pending %d, pending %d after the acks; want 0, 0", ci.NumAckPending, ci.NumPending)
		}
	}
}
