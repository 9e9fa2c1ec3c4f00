package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/dlq"
)

// TestPoisonMessage: a message the collector process dies on (the real
// binary, built with tapflow_failpoints, SIGKILLs itself when it decodes
// that message: a stand-in for an allocation arrow-go dies on) is
// redelivered after every restart until it has been delivered more than
// collector.poison_deliveries times (the shipped default, 5: the setting
// under test); then it goes undecoded to the DLQ with reason poison,
// counted and logged once, and the collector stays up. The 20 healthy
// batches published around it are fetched with it and die with it every
// time, so their delivery counts grow as fast as its own: none of them
// is taken for poison, and every one of their records lands exactly
// once. On the linked nats-server and on Debian's 2.9.
func TestPoisonMessage(t *testing.T) {
	t.Parallel()
	for _, server := range []string{"linked", "debian-2.9"} {
		t.Run(server, func(t *testing.T) {
			t.Parallel()
			if testing.Short() {
				t.Skip("crash loop of the real binary (about a minute): not in -short")
			}
			poisonMessage(t, server)
		})
	}
}

func poisonMessage(t *testing.T, server string) {
	bin, natsBin := chaosBinaries(t)
	dir := t.TempDir()
	nsrv := newNATSProc(t, natsBin, dir)
	if server != "linked" {
		stock, v := chaos.DebianNATS(t)
		if !strings.HasPrefix(v, "2.9.") {
			t.Fatalf("%s is %s, want Debian 12's 2.9.x", stock, v)
		}
		n, err := chaos.NewStockNATS(stock, filepath.Join(dir, "nats"), filepath.Join(dir, "nats.log"))
		if err != nil {
			t.Fatal(err)
		}
		nsrv = &natsProc{NATS: n}
	}
	nsrv.start(t)
	defer nsrv.Close()

	nc, err := nats.Connect("nats://"+nsrv.addr, nats.Name("poison-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := transport.EnsureStreams(ctx, js, transport.DefaultConfig(), quiet); err != nil {
		t.Fatal(err)
	}

	// 10 healthy batches, the poison one, 10 more: all in the stream
	// before the collector starts, so its first fetch takes them together.
	const node, batches, perBatch, poisonSeq = "cmp1", 21, 50, 11
	enc, err := schemas.NewEncoder(schemas.CodecZstd)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	want := map[recID]bool{}
	for seq := int64(1); seq <= batches; seq++ {
		recs := make([]schemas.Flow, perBatch)
		for i := range recs {
			recs[i] = schemas.Flow{Node: node, AgentID: node, BatchSeq: seq, RecordIndex: int32(i), TimeEnd: now.UnixMicro(), Bytes: 1, Packets: 1, TenantID: "t1", Direction: "tx"}
			if seq != poisonSeq {
				want[recID{node, seq, int32(i)}] = true
			}
		}
		body, err := enc.Encode(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, transport.FlowsSubject(node), body, jetstream.WithMsgID(fmt.Sprintf("%s-%d", node, seq))); err != nil {
			t.Fatal(err)
		}
	}
	poisonID := fmt.Sprintf("%s-%d", node, poisonSeq)

	metrics := freeAddr(t)
	out := filepath.Join(dir, "out")
	cfgPath := filepath.Join(dir, "collector.yaml")
	// roll_age 1s / ack_wait 12s (the least ack_wait allows) / nak_delay
	// 200ms as the chaos tests: each crash costs one ack_wait, not 7 min.
	// poison_deliveries is left at its default.
	yaml := fmt.Sprintf(`node: poison-collector
data_dir: %s
nats:
  url: nats://%s
collector:
  output: %s
  roll_age: 1s
  ack_wait: 12s
  nak_delay: 200ms
metrics:
  listen: %s
log:
  format: json
`, filepath.Join(dir, "collector"), nsrv.addr, out, metrics)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	coll, err := chaos.NewProcess(bin, []string{"collector", "--config", cfgPath}, []string{"TAPFLOW_FAILPOINT=consume-decode:" + poisonID}, filepath.Join(dir, "collector.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()

	// Restart it whenever it died, as systemd would, until the poison
	// message is in the DLQ.
	var letters []dlq.Letter
	deadline := time.Now().Add(3 * time.Minute)
	for len(letters) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no poison letter after 3 min; collector log %s", coll.LogPath())
		}
		if !coll.Running() {
			coll.Stop(time.Second) // reaps the dead one
			if err := coll.Start(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(200 * time.Millisecond)
		letters = nil
		if err := dlq.List(ctx, js, dlq.Filter{}, func(l dlq.Letter) error { letters = append(letters, l); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(letters) != 1 || letters[0].Reason != consume.ReasonPoison || letters[0].MsgID != poisonID || letters[0].Records != perBatch ||
		!strings.Contains(letters[0].Error, "poison_deliveries 5") {
		t.Fatalf("dead letters %+v, want one: %s, reason poison, %d records, delivered more than 5 times", letters, poisonID, perBatch)
	}
	crashes := countLog(coll.LogPath(), "failpoint: killing the process while decoding a message")
	if crashes != consume.DefaultPoisonDeliveries {
		t.Fatalf("the collector died %d times on the poison message, want poison_deliveries = %d; log %s", crashes, consume.DefaultPoisonDeliveries, coll.LogPath())
	}

	// Every healthy record lands, and the collector stays up.
	for deadline := time.Now().Add(time.Minute); ; {
		if idle, state := nsrv.consumerIdle(t, transport.DefaultDurable); idle {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("collector did not drain the stream: %s; log %s", state, coll.LogPath())
		}
		if !coll.Running() {
			t.Fatalf("the collector died after the poison message was dead-lettered; log %s", coll.LogPath())
		}
		time.Sleep(300 * time.Millisecond)
	}
	if got := scrapeSeries(t, metrics, `tapflow_consume_poison_total{stream="TAPFLOW_FLOWS"}`); got != "1" {
		t.Errorf("tapflow_consume_poison_total{stream=TAPFLOW_FLOWS} = %q, want 1", got)
	}
	if got := scrapeSeries(t, metrics, `tapflow_consume_poison_total{stream="TAPFLOW_METERS"}`); got != "0" {
		t.Errorf("tapflow_consume_poison_total{stream=TAPFLOW_METERS} = %q, want 0", got)
	}
	if !coll.Stop(30 * time.Second) {
		t.Errorf("collector did not stop gracefully; log %s", coll.LogPath())
	}
	if n := countLog(coll.LogPath(), "poison message: the collector process died decoding it before"); n != 1 {
		t.Errorf("poison logged %d times, want once; log %s", n, coll.LogPath())
	}
	if n := countLog(coll.LogPath(), `"reason":"poison"`); n != 0 {
		t.Errorf("the rate-limited rejection line also logged the poison message (%d lines); log %s", n, coll.LogPath())
	}
	rows := readLocalOutput(out)(t)
	seen := map[recID]int{}
	for _, r := range rows {
		seen[recID{r.AgentID, r.BatchSeq, r.RecordIndex}]++
	}
	dups, lost, extra := 0, 0, 0
	for id, n := range seen {
		if n > 1 {
			dups += n - 1
		}
		if !want[id] {
			extra++
		}
	}
	for id := range want {
		if seen[id] == 0 {
			lost++
		}
	}
	t.Logf("poison: nats-server %s; collector starts %d, deaths on the poison message %d; healthy records %d, in output %d (duplicates %d, lost %d, not expected %d)",
		nsrv.version(t), starts(coll), crashes, len(want), len(rows), dups, lost, extra)
	if dups != 0 || lost != 0 || extra != 0 {
		t.Fatalf("not exactly once: %d duplicates, %d lost, %d records not expected (the poison batch's?); log %s", dups, lost, extra, coll.LogPath())
	}
}

func starts(p *chaos.Process) int { s, _ := p.Counts(); return s }

// freeAddr is a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeSeries returns the value of the series (name{labels} exactly as
// exported) from the /metrics of addr, "" when absent.
func scrapeSeries(t *testing.T, addr, series string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), series+" "); ok {
			return v
		}
	}
	return ""
}
