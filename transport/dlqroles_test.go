package transport_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/dlq"
)

// TestDLQBoundWithCollectorRole: the collector's role (RolePermissions)
// is enough to keep each sender within collector.dlq_letters_per_node on
// a server with per-role users: agent-a's 3 garbage messages and its empty
// message under agent-b's next id are dead-lettered on
// tapflow.dlq.flows.node-a, its oldest beyond 2 evicted, counted and
// tallied, with no permission violation and no "bound not enforced"
// warning; agent-b's letter is untouched.
func TestDLQBoundWithCollectorRole(t *testing.T) {
	b := startSecureBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	colCfg := b.client(t, "collector")
	_, colJS := b.connect(t, colCfg)
	if err := transport.EnsureStreams(ctx, colJS, colCfg, b.log); err != nil {
		t.Fatal(err)
	}
	_, aJS := b.connect(t, b.client(t, "agent-a"))
	_, bJS := b.connect(t, b.client(t, "agent-b"))
	if _, err := bJS.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("node-b"), Data: []byte("garbage b")}, jetstream.WithMsgID("node-b-1")); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := aJS.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("node-a"), Data: []byte("garbage a" + strconv.Itoa(i))}, jetstream.WithMsgID("node-a-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := aJS.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("node-a")}, jetstream.WithMsgID("node-b-2")); err != nil {
		t.Fatal(err)
	}

	ccfg := consume.DefaultConfig()
	ccfg.AckWait = units.Duration(10 * time.Second)
	ccfg.DLQLettersPerNode = 2
	reg := prometheus.NewRegistry()
	src, err := consume.New(colJS, ccfg, consume.Options{Logger: b.log, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	out := make(chan *pipeline.BatchOf[schemas.Flow])
	done := make(chan error, 1)
	go func() { done <- src.Run(rctx, out) }()
	evicted := func() float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "tapflow_consume_dlq_evictions_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return -1
	}
	_, adminJS := b.connect(t, b.client(t, "admin"))
	var evs []transport.DLQEvictions
	for ctx.Err() == nil {
		if evicted() == 2 {
			if evs, err = dlq.Evictions(ctx, adminJS); err == nil && len(evs) == 1 && evs[0].Letters == 2 {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e := evicted(); e != 2 || len(evs) != 1 || evs[0].Sender != "node-a" || evs[0].ByReason[consume.ReasonDecode] != 2 {
		t.Fatalf("evictions %v, tallies %+v; want 2 of node-a's decode letters", e, evs)
	}
	if v := testutil.ToFloat64(colCfg.Metrics.PermissionViolations); v != 0 {
		t.Errorf("collector: %v permission violations:\n%s", v, b.logs.String())
	}
	if strings.Contains(b.logs.String(), "bound not enforced") {
		t.Errorf("the collector could not enforce the bound with its role:\n%s", b.logs.String())
	}
	letters := map[string][]string{}
	if err := dlq.List(ctx, adminJS, dlq.Filter{}, func(l dlq.Letter) error {
		letters[l.Sender] = append(letters[l.Sender], l.MsgID+"/"+l.Reason)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(letters["node-a"], " ") != "node-a-3/decode node-b-2/empty" || strings.Join(letters["node-b"], " ") != "node-b-1/decode" {
		t.Fatalf("letters after the bound: %v", letters)
	}
}
