package consume_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/publish"
)

// publishMeters sends meter batches of the given sizes through the real
// agent meter publisher; record j of batch i has bytes 100*(first+i)+j.
func publishMeters(t *testing.T, s *transporttest.Server, stateDir string, first int, sizes []int) {
	t.Helper()
	pub, err := publish.NewMeters(s.JS, publish.MeterOptions{AgentID: "cmp1", Node: "cmp1", StateDir: stateDir, NATS: transport.DefaultConfig(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.BatchOf[schemas.Meter], len(sizes))
	var wg sync.WaitGroup
	for i, n := range sizes {
		recs := make([]schemas.Meter, n)
		for j := range recs {
			recs[j] = schemas.Meter{Node: "cmp1", Ifname: fmt.Sprintf("tap%d", j), Direction: "tx", Bytes: int64(100*(first+i) + j), Packets: 1, TimeEnd: time.Now().UnixMicro()}
		}
		wg.Add(1)
		in <- pipeline.NewBatchOf(recs, func(err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("publish meter batch %d: %v", i, err)
			}
		})
	}
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// collectMeters runs a meter source until it has seen want records.
func collectMeters(t *testing.T, s *transporttest.Server, want int, reg *prometheus.Registry) []schemas.Meter {
	t.Helper()
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(2 * time.Second)
	src, err := consume.NewMeters(s.JS, cfg, consume.Options{Logger: quiet, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := make(chan *pipeline.BatchOf[schemas.Meter], 4)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	var got []schemas.Meter
	for len(got) < want {
		select {
		case b := <-out:
			got = append(got, b.Records...)
			b.Ack(nil)
		case <-ctx.Done():
			t.Fatalf("got %d meter records, want %d", len(got), want)
		}
	}
	_ = stopSource(cancel, out, done, nil)
	return got
}

// TestMeters publishes meter batches and a flow batch on the meter subject
// (wrong schema), and a flow batch on the flow subject; the meter consumer
// gets every meter record exactly once, dead-letters the flow batch on
// tapflow.dlq.meters, and leaves the flow stream to the flow consumer.
func TestMeters(t *testing.T) {
	for _, sizes := range [][]int{{1}, {2, 0, 300}} {
		t.Run(fmt.Sprint(sizes), func(t *testing.T) {
			s := transporttest.Run(t, "")
			state := t.TempDir()
			publishMeters(t, s, state, 0, sizes[:1])
			fenc, _ := schemas.NewEncoder(schemas.CodecZstd)
			body, _ := fenc.Encode(nil, make([]schemas.Flow, 3))
			if _, err := s.JS.PublishMsg(context.Background(), &nats.Msg{Subject: transport.MetersSubject("cmp1"), Data: body}); err != nil {
				t.Fatal(err)
			}
			publishBatches(t, s, []int{5}) // flows: not for this consumer
			publishMeters(t, s, state, 1, sizes[1:])

			want, wantBytes := 0, int64(0)
			for i, n := range sizes {
				want += n
				for j := range n {
					wantBytes += int64(100*i + j)
				}
			}
			reg := prometheus.NewRegistry()
			// A flow source on the same registry: metrics differ by stream.
			if _, err := consume.New(s.JS, func() consume.Config {
				c := consume.DefaultConfig()
				c.AckWait = units.Duration(time.Minute)
				return c
			}(), consume.Options{Logger: quiet, Registry: reg}); err != nil {
				t.Fatal(err)
			}
			got := collectMeters(t, s, want, reg)
			var bytes int64
			seen := map[[2]int64]bool{}
			for _, r := range got {
				bytes += r.Bytes
				k := [2]int64{r.BatchSeq, int64(r.RecordIndex)}
				if seen[k] || r.AgentID != "cmp1" || r.Node != "cmp1" {
					t.Fatalf("duplicate or unstamped meter record %+v", r)
				}
				seen[k] = true
			}
			if len(got) != want || bytes != wantBytes {
				t.Fatalf("got %d records / %d bytes, want %d / %d", len(got), bytes, want, wantBytes)
			}
			dlq, _ := s.JS.Stream(context.Background(), transport.DLQStream)
			m, err := dlq.GetLastMsgForSubject(context.Background(), transport.DLQSubject(transport.DLQMetersSubject, transport.MetersSubject("cmp1")))
			if err != nil {
				t.Fatalf("no meter dead letter: %v", err)
			}
			if e := m.Header.Get(transport.HeaderError); !strings.Contains(e, `schema "flow.v1", want "meter.v1"`) {
				t.Fatalf("dead letter error %q", e)
			}
			st, _ := s.JS.Stream(context.Background(), transport.FlowsStream)
			if info, _ := st.Info(context.Background()); info.State.Msgs != 1 {
				t.Fatalf("flow stream holds %d messages, want the 1 flow batch", info.State.Msgs)
			}
			c, err := s.JS.Consumer(context.Background(), transport.MetersStream, consume.DefaultConfig().Durable+"-meters")
			if err != nil {
				t.Fatalf("meter consumer: %v", err)
			}
			if info, _ := c.Info(context.Background()); info.NumPending != 0 || info.NumAckPending != 0 {
				t.Fatalf("meter consumer still has pending=%d ack_pending=%d", info.NumPending, info.NumAckPending)
			}
		})
	}
}
