//go:build linux

package source

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/bpf/capture"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
)

// TestSourceConservation runs the source the way the pipeline runner does
// (a consumer acks every batch; out is closed after Run returns) over real
// UDP traffic between two namespaced VMs, and checks Σ flow.v1 bytes and
// packets per tap and direction against the meter.v1 deltas.
func TestSourceConservation(t *testing.T) {
	lab := nslab.New(t)
	a, b := lab.AddVM(1, true), lab.AddVM(2, true)
	cfg := capture.DefaultConfig()
	cfg.Interfaces = []string{lab.Glob()}
	cfg.MemoryBudget = 8 << 20
	cfg.MaxInterfaces = 8
	cfg.MeterInterval = units.Duration(100 * time.Millisecond)
	// Not pinned: this tests the decoding of what the capture exports, not
	// the stop (the machine's /sys/fs/bpf is shared; the stop's shapes are
	// internal/app's TestAgentStopShapes).
	cfg.PinDir = ""

	type key struct{ ifname, dir string }
	var mu sync.Mutex
	meters := map[key][2]int64{}
	reg := prometheus.NewRegistry()
	src, err := New(cfg, Options{Node: "node-a", Registry: reg, Meters: func(_ context.Context, ms []capture.MeterRecord, done func()) error {
		defer done()
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			if m.LostBytes != 0 {
				t.Errorf("lost bytes on %s/%s: %d", m.Ifname, m.Direction, m.LostBytes)
			}
			v := meters[key{m.Ifname, m.Direction}]
			meters[key{m.Ifname, m.Direction}] = [2]int64{v[0] + m.Packets, v[1] + m.Bytes}
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan *pipeline.Batch, 4)
	flows := map[key][2]int64{}
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for bt := range out {
			for _, f := range bt.Records {
				if f.Node != "node-a" || (f.Direction == "tx" && f.Ifname == a.Tap && f.Protocol == 17 && f.VMMACText() != a.MAC.String()) {
					t.Errorf("bad record %+v", f)
				}
				v := flows[key{f.Ifname, f.Direction}]
				flows[key{f.Ifname, f.Direction}] = [2]int64{v[0] + f.Packets, v[1] + f.Bytes}
			}
			bt.Ack(nil)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx, out) }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		mfs, _ := reg.Gather()
		n := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "tapflow_capture_attached_interfaces" {
				n = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("taps not attached within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var pc net.PacketConn
	if err := b.Do(func() (err error) { pc, err = net.ListenPacket("udp4", ":7000"); return }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var conn net.Conn
	if err := a.Do(func() (err error) { conn, err = net.Dial("udp4", b.IP.String()+":7000"); return }); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		conn.Write(bytes.Repeat([]byte{7}, 700))
	}
	conn.Close()
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(out)
	<-consumed
	for _, k := range []key{{a.Tap, "tx"}, {b.Tap, "rx"}} {
		if flows[k] != meters[k] || flows[k][0] < 300 {
			t.Errorf("%v: records %v, meters %v (packets, bytes)", k, flows[k], meters[k])
		}
	}
	for k, m := range meters {
		if flows[k] != m {
			t.Errorf("%v: records %v != meters %v", k, flows[k], m)
		}
	}
}
