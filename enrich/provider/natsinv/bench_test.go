package natsinv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/transport"
)

// The fleet cloud of issue 13: 100,500 ports, 10,000 routers, 50,000
// floating IPs, with UUID ids as a real cloud has them.
var (
	fleetOnce sync.Once
	fleet     *inventory.Inventory
)

func fleetInv() *inventory.Inventory {
	fleetOnce.Do(func() { fleet = synth.WithUUIDs(synth.Generate(synth.Fleet)) })
	return fleet
}

// variant returns inv with one port renamed, so each publish is new content.
func variant(inv *inventory.Inventory, i int) *inventory.Inventory {
	c := *inv
	c.Ports = append([]inventory.Port(nil), inv.Ports...)
	c.Ports[0].Name = strconv.Itoa(i)
	return &c
}

// BenchmarkSnapshotEncodeFleet: the wire encoding (gob+zstd) of the fleet
// cloud against JSON, the baseline (what an inventory file or a Neutron
// listing carries), in the same run.
func BenchmarkSnapshotEncodeFleet(b *testing.B) {
	inv := fleetInv()
	var size int
	for b.Loop() {
		data, _, err := Encode(inv)
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
	}
	js, _ := json.Marshal(inv)
	b.ReportMetric(float64(size), "wire-bytes")
	b.ReportMetric(float64(len(js)), "json-bytes")
	b.ReportMetric(float64(len(js))/float64(size), "json/wire")
	b.Logf("ports %d routers %d floatingips %d: wire %.2f MB, JSON %.1f MB", len(inv.Ports), len(inv.Routers), len(inv.FloatingIPs), float64(size)/1e6, float64(len(js))/1e6)
}

// BenchmarkSnapshotDecodeFleet: the agent's decode, against JSON decode.
func BenchmarkSnapshotDecodeFleet(b *testing.B) {
	inv := fleetInv()
	data, _, _ := Encode(inv)
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"wire", func() error { _, err := Decode(data); return err }},
		{"json-baseline", func() error {
			js, _ := json.Marshal(inv)
			b.ResetTimer()
			var x inventory.Inventory
			return json.Unmarshal(js, &x)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.fn(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStoreFleet: put and get the encoded fleet snapshot through the
// Object Store and through a KV value, on one real nats-server (8 MiB
// max_payload, tapflow's embedded setting; the nats-server default is
// 1 MiB). KV refuses a value above max_payload; the Object Store chunks.
func BenchmarkStoreFleet(b *testing.B) {
	srv := transporttest.Run(b, "")
	ctx := context.Background()
	data, _, _ := Encode(fleetInv())
	big := bytes.Repeat(data, 9) // a cloud 9× larger (or ids that compress worse)
	obs, err := EnsureStore(ctx, srv.JS, StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	kv, err := srv.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BENCH_KV", History: 1})
	if err != nil {
		b.Fatal(err)
	}
	for _, sz := range []struct {
		name string
		data []byte
	}{{"fleet", data}, {"fleet-x9", big}} {
		b.Run("objectstore/"+sz.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := obs.PutBytes(ctx, "bench", sz.data); err != nil {
					b.Fatal(err)
				}
				got, err := obs.GetBytes(ctx, "bench")
				if err != nil || len(got) != len(sz.data) {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(sz.data)), "bytes")
		})
		b.Run("kv/"+sz.name, func(b *testing.B) {
			_, refused := kv.Put(ctx, "bench", sz.data)
			for b.Loop() {
				if refused != nil {
					continue // nothing to time
				}
				if _, err := kv.Put(ctx, "bench", sz.data); err != nil {
					b.Fatal(err)
				}
				e, err := kv.Get(ctx, "bench")
				if err != nil || len(e.Value()) != len(sz.data) {
					b.Fatal(err)
				}
			}
			if refused != nil {
				b.Logf("KV refuses %d bytes: %v", len(sz.data), refused)
				b.ReportMetric(0, "accepted")
				return
			}
			b.ReportMetric(1, "accepted")
			b.ReportMetric(float64(len(sz.data)), "bytes")
		})
	}
}

// BenchmarkPublishFleet: the service's publish (encode, compare with the
// head, put) of a changed fleet inventory.
func BenchmarkPublishFleet(b *testing.B) {
	srv := transporttest.Run(b, "")
	obs, err := EnsureStore(context.Background(), srv.JS, StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	inv := fleetInv()
	i := 0
	var res Published
	for b.Loop() {
		i++
		if res, err = Publish(context.Background(), obs, variant(inv, i), time.Now()); err != nil || res.Skipped {
			b.Fatal(err, res.Skipped)
		}
	}
	b.ReportMetric(float64(res.Bytes), "wire-bytes")
}

// BenchmarkAgentLoadFleet: an agent's cold start from the store —
// download, decode, snapshot build — and the memory the result holds.
func BenchmarkAgentLoadFleet(b *testing.B) {
	srv := transporttest.Run(b, "")
	obs, err := EnsureStore(context.Background(), srv.JS, StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := Publish(context.Background(), obs, fleetInv(), time.Now()); err != nil {
		b.Fatal(err)
	}
	var live uint64
	var snap *snapshot.Snapshot
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		p, err := NewProvider(srv.NC, Options{StatePath: filepath.Join(b.TempDir(), "s"), Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		inv, _, err := p.Poll(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		snap = snapshot.Build(inv, snapshot.Options{Version: 1})
		b.StopTimer()
		p = nil
		inv = nil
		runtime.GC()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		live = m1.HeapAlloc - min(m0.HeapAlloc, m1.HeapAlloc)
		b.StartTimer()
	}
	b.ReportMetric(float64(live)/(1<<20), "snapshot-live-MiB")
	b.ReportMetric(vmKiB("VmHWM")/1024, "process-peak-RSS-MiB")
	if snap.Stats().Endpoints < 60000 {
		b.Fatalf("endpoints %d", snap.Stats().Endpoints)
	}
}

func vmKiB(field string) float64 {
	raw, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, field+":") {
			v, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return v
		}
	}
	return 0
}

// BenchmarkColdStart1000Agents: 1,000 agents (NATS clients over loopback
// TCP, in this process) cold-start at once against one nats-server
// holding the fleet snapshot: time until every one holds it whole
// (the provider's own download: direct gets, SHA-256 checked), and bytes
// served. The baseline,
// today's per-agent polling, is 1,000 full listings per refresh: its
// bytes are at least 1,000 × the JSON of the inventory, reported beside.
// TAPFLOW_BENCH_AGENTS changes the count.
func BenchmarkColdStart1000Agents(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("TAPFLOW_BENCH_AGENTS")); err == nil && v > 0 {
		n = v
	}
	srv := transporttest.Run(b, "")
	ctx := context.Background()
	obs, err := EnsureStore(ctx, srv.JS, StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	res, err := Publish(ctx, obs, fleetInv(), time.Now())
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]*nats.Conn, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var connErr atomic.Pointer[error]
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			nc, err := nats.Connect(srv.ClientURL(), nats.Name(fmt.Sprintf("agent-%d", i)))
			if err != nil {
				connErr.Store(&err)
				return
			}
			conns[i] = nc
		}()
	}
	wg.Wait()
	b.Cleanup(func() {
		for _, nc := range conns {
			if nc != nil {
				nc.Close()
			}
		}
	})
	if e := connErr.Load(); e != nil {
		b.Fatal(*e)
	}
	var took time.Duration
	var served, wire atomic.Int64
	for b.Loop() {
		served.Store(0)
		before := int64(0)
		for _, nc := range conns {
			before += int64(nc.Stats().InBytes)
		}
		start := time.Now()
		var failed atomic.Int64
		var firstErr atomic.Pointer[error]
		fail := func(err error) {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, &err)
		}
		for _, nc := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
				defer cancel()
				// what the agent's provider does: open, head, download
				js, _ := jetstream.New(nc)
				o, st, err := open(cctx, js)
				if err != nil {
					fail(err)
					return
				}
				info, err := o.GetInfo(cctx, transport.InventoryObject)
				if err != nil {
					fail(err)
					return
				}
				var data []byte
				if os.Getenv("TAPFLOW_BENCH_DOWNLOAD") == "objectget" { // the Object Store's own Get, for comparison
					data, err = o.GetBytes(cctx, transport.InventoryObject)
				} else {
					data, err = Download(cctx, st, info)
				}
				if err != nil || len(data) != res.Bytes {
					fail(fmt.Errorf("%d of %d bytes: %v", len(data), res.Bytes, err))
					return
				}
				served.Add(int64(len(data)))
			}()
		}
		wg.Wait()
		took = time.Since(start)
		if f := failed.Load(); f > 0 {
			b.Fatalf("%d of %d agents did not get the snapshot after %s; first error: %v", f, n, took, *firstErr.Load())
		}
		after := int64(0)
		for _, nc := range conns {
			after += int64(nc.Stats().InBytes)
		}
		wire.Store(after - before)
	}
	js, _ := json.Marshal(fleetInv())
	b.ReportMetric(took.Seconds(), "s-until-all")
	b.ReportMetric(float64(wire.Load())/1e6, "MB-on-wire")
	b.ReportMetric(float64(n)*float64(len(js))/1e6, "MB-polling-baseline")
	b.ReportMetric(float64(n)*float64(len(js))/float64(wire.Load()), "polling/served")
	b.Logf("%d agents: all held the %d-byte snapshot after %s; %.1f MB on the wire (payload %.1f MB); per-agent polling would move ≥ %.0f MB (JSON) and run %d full listings",
		n, res.Bytes, took.Round(time.Millisecond), float64(wire.Load())/1e6, float64(served.Load())/1e6, float64(n)*float64(len(js))/1e6, n)
}

// BenchmarkDeltaFleet: a change of 1, 100 or 10,000 ports of the fleet
// cloud as a delta against the full snapshot it spares each agent, with
// the service's diff and the agent's apply time.
func BenchmarkDeltaFleet(b *testing.B) {
	base := Normalize(fleetInv())
	full, _, _ := Encode(base)
	for _, n := range []int{1, 100, 10000} {
		next := *base
		next.Ports = slicesClone(base.Ports)
		for i := range n {
			next.Ports[i*len(next.Ports)/n].Name = "changed"
		}
		b.Run(fmt.Sprintf("ports-%d/diff", n), func(b *testing.B) {
			var size int
			for b.Loop() {
				m, err := encodeDelta(1, &Snapshot{Version: 2, FetchedAt: time.Now(), Inv: &next}, Diff(base, &next))
				if err != nil {
					b.Fatal(err)
				}
				size = len(m.Data)
			}
			b.ReportMetric(float64(size), "delta-bytes")
			b.ReportMetric(float64(len(full)), "snapshot-bytes")
			b.ReportMetric(float64(len(full))/float64(size), "snapshot/delta")
		})
		b.Run(fmt.Sprintf("ports-%d/apply", n), func(b *testing.B) {
			d := Diff(base, &next)
			for b.Loop() {
				if got := Apply(base, d); len(got.Ports) != len(base.Ports) {
					b.Fatal("ports")
				}
			}
		})
	}
}

func slicesClone[T any](s []T) []T { return append([]T(nil), s...) }
