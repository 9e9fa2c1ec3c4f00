package consume_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// TestPoisonOnlyTheMessageTheProcessDiedOn: against a real server, four
// batches are nacked (a failing sink) until each was delivered 6 times,
// more than poison_deliveries (5), by a source that keeps its decoding
// marker; then a new source starts whose marker says its predecessors
// died decoding the fourth, three times. Only that one goes to the DLQ (reason
// poison, undecoded, counted from 0); the three others, delivered as
// often but decoded fine every time, arrive whole. The redeliveries come
// in any order, so the second run ends once the three arrived and the
// dead letter is in the DLQ, whichever came last.
func TestPoisonOnlyTheMessageTheProcessDiedOn(t *testing.T) {
	s := transporttest.Run(t, "")
	publishBatches(t, s, []int{10, 20, 30, 40}) // stream seqs 1..4
	state := t.TempDir()
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(5 * time.Second)
	cfg.NakDelay = units.Duration(50 * time.Millisecond)
	if cfg.PoisonDeliveries != 5 {
		t.Fatalf("default poison_deliveries %d, want 5", cfg.PoisonDeliveries)
	}

	// until is asked after each batch (then acked with ackErr) and, with
	// nil, every 50 ms: the source stops once it says so.
	run := func(reg *prometheus.Registry, until func(*pipeline.BatchOf[schemas.Flow]) bool, ackErr error) {
		t.Helper()
		src, err := consume.New(s.JS, cfg, consume.Options{Logger: quiet, Registry: reg, StateDir: state})
		if err != nil {
			t.Fatal(err)
		}
		{
			for _, r := range consume.Reasons {
				if got := counterValue(t, reg, "tapflow_consume_rejected_messages_total", r); got != 0 {
					t.Fatalf("rejected{reason=%s} = %v at start, want 0", r, got)
				}
			}
			if got := gaugeOrCounter(t, reg, "tapflow_consume_poison_total"); got != 0 {
				t.Fatalf("tapflow_consume_poison_total = %v at start, want 0 (exported)", got)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out := make(chan *pipeline.Batch, 4)
		done := make(chan error, 1)
		go func() { done <- src.Run(ctx, out) }()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			stop := false
			select {
			case b := <-out:
				stop = until(b)
				b.Ack(ackErr)
			case <-tick.C:
				stop = until(nil)
			case <-ctx.Done():
				t.Fatal("timed out")
			}
			if stop {
				if err := stopSource(cancel, out, done, ackErr); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
	}

	// A failing sink: every batch nacked until each was delivered 6 times.
	seen := map[int64]int{}
	run(prometheus.NewRegistry(), func(b *pipeline.BatchOf[schemas.Flow]) bool {
		if b != nil {
			seen[b.Seq]++
		}
		for seq := int64(1); seq <= 4; seq++ {
			if seen[seq] < 6 {
				return false
			}
		}
		return true
	}, errors.New("disk full"))

	// Processes died decoding stream seq 4 three times (poisonDeaths): the
	// last death in slot 0, the two before in the ring.
	var slot [24]byte
	for i := range 3 {
		binary.LittleEndian.PutUint64(slot[8*i:], 4)
	}
	f, err := os.OpenFile(filepath.Join(state, transport.FlowsStream+".decoding"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("the source left no decoding marker: %v", err)
	}
	if _, err := f.WriteAt(slot[:], 0); err != nil {
		t.Fatal(err)
	}
	f.Close()

	reg := prometheus.NewRegistry()
	got := map[int64]int{}
	letterSubject := transport.DLQSubject(transport.DLQFlowsSubject, transport.FlowsSubject("cmp1"))
	lettered := func() bool { // the dead letter is in the DLQ
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		dl, err := s.JS.Stream(ctx, transport.DLQStream)
		if err != nil {
			return false
		}
		_, err = dl.GetLastMsgForSubject(ctx, letterSubject)
		return err == nil
	}
	run(reg, func(b *pipeline.BatchOf[schemas.Flow]) bool {
		if b != nil {
			got[b.Seq] += len(b.Records)
		}
		return len(got) == 3 && got[1] == 10 && got[2] == 20 && got[3] == 30 && lettered()
	}, nil)
	if got[4] != 0 || len(got) != 3 {
		t.Fatalf("records by stream seq %v, want 1:10 2:20 3:30 and nothing of the poison message 4", got)
	}
	// The dead letter is published before the source moves on; the
	// counter is set before it.
	if p, r := gaugeOrCounter(t, reg, "tapflow_consume_poison_total"), counterValue(t, reg, "tapflow_consume_rejected_messages_total", consume.ReasonPoison); p != 1 || r != 1 {
		t.Fatalf("poison_total %v, rejected{poison} %v; want 1 and 1", p, r)
	}
	dl, err := s.JS.Stream(context.Background(), transport.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := dl.GetLastMsgForSubject(context.Background(), letterSubject)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(transport.HeaderReason) != consume.ReasonPoison || m.Header.Get(transport.HeaderOrigSeq) != "4" || !strings.HasPrefix(m.Header.Get(transport.HeaderOrigMsgID), "cmp1-") || m.Header.Get("Tapflow-Records") != "40" {
		t.Fatalf("dead letter headers %v", m.Header)
	}
}

func gaugeOrCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}

// TestPoisonDeliveriesValidate: the key's range.
func TestPoisonDeliveriesValidate(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{1, false}, {2, true}, {5, true}, {100, true}, {101, false}, {-1, false}} {
		cfg := consume.DefaultConfig()
		cfg.PoisonDeliveries = tc.n
		err := cfg.Validate(5 * time.Minute)
		if (err == nil) != tc.ok {
			t.Errorf("poison_deliveries %d: err %v, want ok=%v", tc.n, err, tc.ok)
		}
	}
}
