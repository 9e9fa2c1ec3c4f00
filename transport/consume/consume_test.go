package consume_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/publish"
)

var quiet = slog.New(slog.DiscardHandler)

// publishBatches sends batches of the given sizes through the real agent sink.
func publishBatches(t *testing.T, s *transporttest.Server, sizes []int) {
	t.Helper()
	pub, err := publish.New(s.JS, publish.Options{AgentID: "cmp1", Node: "cmp1", StateDir: t.TempDir(), NATS: transport.DefaultConfig(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.Batch, len(sizes))
	var wg sync.WaitGroup
	for i, n := range sizes {
		recs := make([]schemas.Flow, n)
		for j := range recs {
			recs[j] = schemas.Flow{Bytes: int64(100*i + j), Packets: 1, TenantID: "t1", Direction: "tx", Node: "cmp1", TimeEnd: time.Now().UnixMicro()}
		}
		wg.Add(1)
		in <- pipeline.NewBatch(recs, func(err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("publish batch %d: %v", i, err)
			}
		})
	}
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// collect runs the source until it has seen want records (or times out),
// acking each batch with ackErr.
func collect(t *testing.T, s *transporttest.Server, want int, ackErr error) []schemas.Flow {
	t.Helper()
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(2 * time.Second)
	cfg.NakDelay = units.Duration(100 * time.Millisecond)
	src, err := consume.New(s.JS, cfg, consume.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make(chan *pipeline.Batch, 4)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	var got []schemas.Flow
	for len(got) < want {
		select {
		case b := <-out:
			got = append(got, b.Records...)
			b.Ack(ackErr)
		case <-ctx.Done():
			t.Fatalf("got %d records, want %d", len(got), want)
		}
	}
	_ = stopSource(cancel, out, done, ackErr)
	return got
}

func TestPublishConsumeExactCounts(t *testing.T) {
	for _, sizes := range [][]int{{1}, {10, 0, 2000}, {5000, 5000, 5000, 7}} {
		t.Run(fmt.Sprint(sizes), func(t *testing.T) {
			s := transporttest.Run(t, "")
			publishBatches(t, s, sizes)
			want, wantBytes := 0, int64(0)
			for i, n := range sizes {
				want += n
				for j := range n {
					wantBytes += int64(100*i + j)
				}
			}
			got := collect(t, s, want, nil)
			var bytes int64
			seen := map[[2]int64]bool{}
			for _, r := range got {
				bytes += r.Bytes
				k := [2]int64{r.BatchSeq, int64(r.RecordIndex)}
				if seen[k] || r.AgentID != "cmp1" {
					t.Fatalf("duplicate or unstamped record %+v", k)
				}
				seen[k] = true
			}
			if len(got) != want || bytes != wantBytes {
				t.Fatalf("got %d records / %d bytes, want %d / %d", len(got), bytes, want, wantBytes)
			}
		})
	}
}

func TestNakRedelivers(t *testing.T) {
	s := transporttest.Run(t, "")
	publishBatches(t, s, []int{100})
	collect(t, s, 100, fmt.Errorf("disk full"))
	// Nothing was acked: the same records come back.
	if got := collect(t, s, 100, nil); len(got) != 100 {
		t.Fatalf("redelivered %d records, want 100", len(got))
	}
}

func TestCorruptMessageGoesToDLQ(t *testing.T) {
	s := transporttest.Run(t, "")
	publishBatches(t, s, []int{50})
	bad := &nats.Msg{Subject: transport.FlowsSubject("cmp1"), Data: []byte("definitely not arrow")}
	if _, err := s.JS.PublishMsg(context.Background(), bad); err != nil {
		t.Fatal(err)
	}
	publishBatches(t, s, []int{70})
	if got := collect(t, s, 120, nil); len(got) != 120 {
		t.Fatalf("good records: got %d, want 120", len(got))
	}
	dlq, err := s.JS.Stream(context.Background(), transport.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := dlq.GetLastMsgForSubject(context.Background(), transport.DLQSubject(transport.DLQFlowsSubject, transport.FlowsSubject("cmp1")))
	if err != nil {
		t.Fatalf("no dead letter: %v", err)
	}
	if string(m.Data) != "definitely not arrow" || m.Header.Get(transport.HeaderOrigSeq) != "2" || m.Header.Get(transport.HeaderError) == "" {
		t.Fatalf("dead letter %q headers %v", m.Data, m.Header)
	}
	// The corrupt message was terminated: nothing is left for the
	// consumer. The server applies the term asynchronously: poll.
	c, err := s.JS.Consumer(context.Background(), transport.FlowsStream, consume.DefaultConfig().Durable)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer still has pending=%d ack_pending=%d", info.NumPending, info.NumAckPending)
		}
	}
}

func TestRepublishSameSeqIsDeduplicated(t *testing.T) {
	s := transporttest.Run(t, "")
	enc, _ := schemas.NewEncoder("zstd")
	body, _ := enc.Encode(nil, make([]schemas.Flow, 10))
	for range 3 {
		msg := &nats.Msg{Subject: transport.FlowsSubject("cmp1"), Data: body}
		if _, err := s.JS.PublishMsg(context.Background(), msg, js.WithMsgID("cmp1-42")); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := s.JS.Stream(context.Background(), transport.FlowsStream)
	info, _ := st.Info(context.Background())
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1 (Nats-Msg-Id dedupe)", info.State.Msgs)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		mod   func(*consume.Config)
		valid bool
	}{
		{"default", func(*consume.Config) {}, true},
		{"ack wait shorter than roll age", func(c *consume.Config) { c.AckWait = units.Duration(time.Minute) }, false},
		{"tiny max ack pending", func(c *consume.Config) { c.MaxAckPending = 3 }, false},
		{"no durable", func(c *consume.Config) { c.Durable = "" }, false},
		{"fetch batch above half of max ack pending", func(c *consume.Config) { c.MaxAckPending = 100; c.FetchBatch = 64 }, false},
		{"no record limit", func(c *consume.Config) { c.MaxBatchRecords = 0 }, false},
		{"record limit beyond 16M", func(c *consume.Config) { c.MaxBatchRecords = 1<<24 + 1 }, false},
		{"message cap below 1MiB", func(c *consume.Config) { c.MaxMessageBytes = 1<<20 - 1 }, false},
		{"message cap above 512MiB", func(c *consume.Config) { c.MaxMessageBytes = 513 << 20 }, false},
		{"message cap 512MiB", func(c *consume.Config) { c.MaxMessageBytes = 512 << 20 }, true},
		{"record age under 1h", func(c *consume.Config) { c.MaxRecordAge = units.Duration(time.Minute) }, false},
		{"no clock skew", func(c *consume.Config) { c.MaxClockSkew = 0 }, false},
		{"clock skew 1s", func(c *consume.Config) { c.MaxClockSkew = units.Duration(time.Second) }, true},
		{"record age 365d", func(c *consume.Config) { c.MaxRecordAge = units.Duration(365 * 24 * time.Hour) }, true},
		{"record age beyond 365d (outside the sink's years)", func(c *consume.Config) { c.MaxRecordAge = units.Duration(30 * 365 * 24 * time.Hour) }, false},
		{"clock skew 7d", func(c *consume.Config) { c.MaxClockSkew = units.Duration(7 * 24 * time.Hour) }, true},
		{"clock skew beyond 7d", func(c *consume.Config) { c.MaxClockSkew = units.Duration(8 * 24 * time.Hour) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := consume.DefaultConfig()
			tc.mod(&c)
			err := c.Validate(5 * time.Minute)
			if (err == nil) != tc.valid {
				t.Fatalf("Validate = %v, valid want %v", err, tc.valid)
			}
		})
	}
}

// TestHeldMessagesAreNotRedelivered: a batch the sink holds for 4× the
// ack wait (a file waiting to roll, a full disk, S3 down) is kept alive
// with in-progress acks: JetStream does not redeliver it.
func TestHeldMessagesAreNotRedelivered(t *testing.T) {
	s := transporttest.Run(t, "")
	publishBatches(t, s, []int{10, 10})
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(time.Second)
	src, err := consume.New(s.JS, cfg, consume.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *pipeline.Batch, 8)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	var held []*pipeline.Batch
	seen := map[int64]int{}
	deadline := time.After(4 * time.Second)
loop:
	for {
		select {
		case b := <-out:
			seen[b.Seq]++
			held = append(held, b)
		case <-deadline:
			break loop
		}
	}
	for seq, n := range seen {
		if n > 1 {
			t.Errorf("stream seq %d delivered %d times while held", seq, n)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("got %d distinct messages, want 2", len(seen))
	}
	for _, b := range held {
		b.Ack(nil)
	}
	_ = stopSource(cancel, out, done, nil)
	c, _ := s.JS.Consumer(context.Background(), transport.FlowsStream, cfg.Durable)
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("ack pending %d, redelivered %d; want 0, 0", info.NumAckPending, info.NumRedelivered)
	}
}

// stopSource cancels a running source, acks (with ackErr) whatever it
// still forwards while stopping, waits for Run and returns its error.
func stopSource[T any](cancel context.CancelFunc, out chan *pipeline.BatchOf[T], done <-chan error, ackErr error) error {
	cancel()
	go func() {
		for b := range out {
			b.Ack(ackErr)
		}
	}()
	err := <-done
	close(out)
	return err
}
