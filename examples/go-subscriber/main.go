// Command go-subscriber is an example NATS subscriber of tapflow flow
// records that uses no tapflow code: nats.go, arrow-go and a zstd
// library, following docs/subscribers.md. It sums bytes by tenant × zone
// from live messages and prints the table when it has read -records
// records (or on Ctrl-C).
//
//	go run . -server nats://127.0.0.1:4222 -records 100000
//	go run . -server nats://127.0.0.1:4222 -durable analytics   # survives restarts
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	server := flag.String("server", nats.DefaultURL, "NATS URL")
	creds := flag.String("creds", "", "NATS credentials file (JWT), if the server wants one")
	durable := flag.String("durable", "", "attach a durable consumer of this name (acked, resumes after a restart); empty: an ordered ephemeral consumer")
	records := flag.Int64("records", 0, "print the table and exit after this many records (0: on Ctrl-C)")
	flag.Parse()

	var opts []nats.Option
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	nc, err := nats.Connect(*server, opts...)
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	cons, err := consumer(ctx, js, *durable)
	if err != nil {
		log.Fatalf("consumer: %v", err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		log.Fatal(err)
	}
	go func() { <-ctx.Done(); msgs.Stop() }()
	fmt.Fprintln(os.Stderr, "subscribed to TAPFLOW_FLOWS")

	zd, _ := zstd.NewReader(nil)
	totals := map[[2]string]int64{}
	var seen int64
	for *records == 0 || seen < *records {
		msg, err := msgs.Next()
		if err != nil {
			break // Ctrl-C
		}
		n, err := add(totals, msg, zd)
		if err != nil {
			log.Printf("skipping %s: %v", msg.Headers().Get("Nats-Msg-Id"), err)
		}
		seen += n
		if *durable != "" {
			_ = msg.Ack() // the stream keeps a message until every durable acked it
		}
	}
	printTable(totals)
}

// consumer attaches next to the collector without taking its messages:
// new messages only, and either an ordered consumer (ephemeral, no acks)
// or a durable one that the server deletes after an hour without a pull.
func consumer(ctx context.Context, js jetstream.JetStream, durable string) (jetstream.Consumer, error) {
	if durable == "" {
		return js.OrderedConsumer(ctx, "TAPFLOW_FLOWS", jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"tapflow.flows.v1.>"},
			DeliverPolicy:  jetstream.DeliverNewPolicy,
			// Not yet sent messages stay in the stream for it: let the
			// server drop it soon after this process is gone.
			InactiveThreshold: 10 * time.Second,
		})
	}
	return js.CreateOrUpdateConsumer(ctx, "TAPFLOW_FLOWS", jetstream.ConsumerConfig{
		Durable:           durable,
		FilterSubject:     "tapflow.flows.v1.>",
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           time.Minute,
		MaxAckPending:     1000,
		InactiveThreshold: time.Hour,
	})
}

// add sums one message's bytes into totals and returns its record count.
func add(totals map[[2]string]int64, msg jetstream.Msg, zd *zstd.Decoder) (int64, error) {
	h := msg.Headers()
	if s := h.Get("Tapflow-Schema"); s != "flow.v1" {
		return 0, fmt.Errorf("schema %q, want flow.v1", s)
	}
	body := msg.Data()
	switch codec := h.Get("Tapflow-Codec"); codec {
	case "zstd": // the Arrow IPC stream in one zstd frame
		var err error
		if body, err = zd.DecodeAll(body, nil); err != nil {
			return 0, err
		}
	case "arrow-zstd", "lz4", "none": // Arrow IPC; arrow-go decompresses buffers itself
	default:
		return 0, fmt.Errorf("codec %q unknown to this subscriber", codec)
	}
	r, err := ipc.NewReader(bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer r.Release()
	var n int64
	for r.Next() {
		rec := r.RecordBatch()
		tenant, zone := stringColumn(rec, "tenant_id"), stringColumn(rec, "zone")
		byts := column[*array.Int64](rec, "bytes")
		if tenant == nil || zone == nil || byts == nil {
			return n, errors.New("tenant_id, zone or bytes missing (or not strings)")
		}
		for i := range int(rec.NumRows()) {
			totals[[2]string{tenant(i), zone(i)}] += byts.Value(i)
		}
		n += rec.NumRows()
	}
	if err := r.Err(); err != nil && !errors.Is(err, io.EOF) {
		return n, err
	}
	return n, nil
}

// column finds a column by name (readers must: new columns get appended).
func column[A arrow.Array](rec arrow.RecordBatch, name string) A {
	var zero A
	idx := rec.Schema().FieldIndices(name)
	if len(idx) != 1 {
		return zero
	}
	a, _ := rec.Column(idx[0]).(A)
	return a
}

// stringColumn reads a string column in either wire form: tapflow agents
// send low-cardinality strings (tenant_id, zone, …) dictionary-encoded,
// agents from before that plain utf8, so both occur during an upgrade.
func stringColumn(rec arrow.RecordBatch, name string) func(int) string {
	idx := rec.Schema().FieldIndices(name)
	if len(idx) != 1 {
		return nil
	}
	switch a := rec.Column(idx[0]).(type) {
	case *array.String:
		return a.Value
	case *array.Dictionary:
		if dict, ok := a.Dictionary().(*array.String); ok {
			return func(i int) string { return dict.Value(a.GetValueIndex(i)) }
		}
	}
	return nil
}

func printTable(totals map[[2]string]int64) {
	keys := make([][2]string, 0, len(totals))
	for k := range totals {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	fmt.Printf("%-40s %-14s %14s\n", "tenant_id", "zone", "bytes")
	for _, k := range keys {
		fmt.Printf("%-40s %-14s %14d\n", k[0], k[1], totals[k])
	}
}
