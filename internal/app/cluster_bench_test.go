package app

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
)

var (
	benchBatchesOnce sync.Once
	benchBatches     [][]schemas.Flow
)

// publishBatches generates a few attributed synthetic batches of the
// default size (16384 records) once.
func publishBatches(b *testing.B) [][]schemas.Flow {
	benchBatchesOnce.Do(func() {
		cfg := synthetic.DefaultConfig()
		cfg.RecordsPerSecond, cfg.Attributed = 0, true
		src, err := synthetic.New(cfg, synthetic.Options{Node: "bench", Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan *pipeline.Batch, 4)
		go func() { _ = src.Run(ctx, out); close(out) }()
		for bt := range out {
			if len(benchBatches) < 8 {
				benchBatches = append(benchBatches, bt.Records)
			} else {
				cancel()
			}
			bt.Ack(nil)
		}
		cancel()
	})
	return benchBatches
}

// BenchmarkPublishReplicas: the agent's publisher (transport/publish: stamp,
// Arrow IPC zstd, one synchronous JetStream publish per batch) into
// TAPFLOW_FLOWS on real nats-server processes: R1 on a single server, R1
// and R3 on a three-node cluster. One op is one 16384-record batch acked
// by JetStream (with R3: stored on a quorum of two nodes). The servers
// keep nats-server's default max_payload (1 MiB), as an existing cluster
// would, so a batch is published as two messages.
func BenchmarkPublishReplicas(b *testing.B) {
	for _, bc := range []struct {
		name            string
		nodes, replicas int
	}{
		{"R1", 1, 1},
		{"R1cluster", 3, 1},
		{"R3", 3, 3},
	} {
		b.Run(bc.name, func(b *testing.B) {
			benchPublish(b, bc.nodes, bc.replicas)
		})
	}
}

func benchPublish(b *testing.B, nodes, replicas int) {
	batches := publishBatches(b)
	dir := b.TempDir()
	cl, err := chaos.NewCluster(natsServerBinary(b), filepath.Join(dir, "nats"), nodes)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Start(2 * time.Minute); err != nil {
		b.Fatal(err)
	}
	cfg := transport.DefaultConfig()
	cfg.URL, cfg.Replicas = cl.URLs(), replicas
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := transport.Connect(ctx, cfg, "bench-agent", quiet)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if err := transport.EnsureStreams(ctx, js, cfg, quiet); err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pub, err := publish.New(js, publish.Options{AgentID: "bench", Node: "bench", StateDir: filepath.Join(dir, "agent"),
		NATS: cfg, Logger: quiet, Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	in := make(chan *pipeline.Batch)
	done := make(chan error, 1)
	go func() { done <- pub.Run(context.Background(), in) }()
	var failed sync.Once
	var pubErr error
	acked := make(chan struct{}, 1)
	send := func(recs []schemas.Flow) {
		in <- pipeline.NewBatch(recs, func(err error) {
			if err != nil {
				failed.Do(func() { pubErr = err })
			}
			acked <- struct{}{}
		})
		<-acked
	}
	// Warm up: connection, stream leader, first file blocks.
	for _, recs := range batches {
		send(recs)
	}
	bytes0, msgs0 := gatherCounter(reg, "tapflow_publish_bytes_total"), gatherCounter(reg, "tapflow_publish_batches_total")
	records, ops := 0, 0
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		recs := batches[i%len(batches)]
		send(recs)
		records += len(recs)
		ops++
	}
	elapsed := time.Since(start)
	close(in)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if pubErr != nil {
		b.Fatal(pubErr)
	}
	bytes := gatherCounter(reg, "tapflow_publish_bytes_total") - bytes0
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
	b.ReportMetric(bytes/1e6/elapsed.Seconds(), "MB/s")
	// Above the server's max_payload (1 MiB by default) a batch is split:
	// messages per op says how many publishes one batch took.
	b.ReportMetric((gatherCounter(reg, "tapflow_publish_batches_total")-msgs0)/float64(ops), "msgs/op")
	info, err := cl.StreamInfo(transport.FlowsStream)
	if err != nil {
		b.Fatal(err)
	}
	if info.Config.Replicas != replicas {
		b.Fatalf("stream has %d replicas, want %d", info.Config.Replicas, replicas)
	}
}
