package enrich

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// kernelSource stands in for the eBPF source (bpf/source has the real
// one; bpf/capture's TestExportLive proves its export): records "live in
// the kernel" leave only when ExportLive asks, or at stop (the shutdown
// flush) — as a UDP flow waits for its idle timeout.
type kernelSource struct {
	mu      sync.Mutex
	live    []schemas.Flow
	emitted uint64
	reqs    chan chan uint64
	fail    error // ExportLive fails with it
	exports int
}

func newKernelSource() *kernelSource { return &kernelSource{reqs: make(chan chan uint64)} }

func (k *kernelSource) Name() string { return "kernel" }

func (k *kernelSource) add(f schemas.Flow) { k.mu.Lock(); k.live = append(k.live, f); k.mu.Unlock() }

func (k *kernelSource) take() []schemas.Flow {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.live
	k.live = nil
	return l
}

func (k *kernelSource) Run(ctx context.Context, out chan<- *pipeline.Batch) error {
	for {
		select {
		case <-ctx.Done():
			if l := k.take(); len(l) > 0 {
				out <- pipeline.NewBatch(l, nil)
			}
			return nil
		case done := <-k.reqs:
			if l := k.take(); len(l) > 0 {
				out <- pipeline.NewBatch(l, nil)
				k.emitted++
			}
			done <- k.emitted
		}
	}
}

func (k *kernelSource) ExportLive(ctx context.Context) (uint64, error) {
	k.mu.Lock()
	k.exports++
	fail := k.fail
	k.mu.Unlock()
	if fail != nil {
		return 0, fail
	}
	done := make(chan uint64, 1)
	select {
	case k.reqs <- done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case n := <-done:
		return n, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// gate is a transform between the source and the engine: slow (every
// batch waits, so an exported batch is still on its way when the export
// returns) or closed (downstream blocked until opened).
type gate struct {
	delay time.Duration
	open  chan struct{}
}

func (g *gate) Name() string { return "gate" }
func (g *gate) Apply(ctx context.Context, b *pipeline.Batch) error {
	if g.open != nil {
		<-g.open
	}
	time.Sleep(g.delay)
	return nil
}

type keepSink struct {
	mu   sync.Mutex
	recs []schemas.Flow
}

func (s *keepSink) Name() string { return "keep" }
func (s *keepSink) Run(ctx context.Context, in <-chan *pipeline.Batch) error {
	for b := range in {
		s.mu.Lock()
		s.recs = append(s.recs, b.Records...)
		s.mu.Unlock()
		b.Ack(nil)
	}
	return nil
}

// Barrier inventories: acme (t1) with a1 and a2, a router r1 gatewayed on
// public; variants move the gateway, give a1's MAC to globex (t2), or add
// a VM.
const (
	bInvHead = `
networks:
  - {id: n1, name: acme-net, project_id: t1}
  - {id: n2, name: globex-net, project_id: t2}
  - {id: pub, name: public, "router:external": true}
  - {id: pub2, name: public2, "router:external": true}
subnets:
  - {id: s1, network_id: n1, cidr: 10.0.0.0/24, gateway_ip: 10.0.0.1}
  - {id: s2, network_id: n2, cidr: 10.1.0.0/24, gateway_ip: 10.1.0.1}
`
	bRouterPub  = "routers:\n  - {id: r1, project_id: t1, external_gateway_info: {network_id: pub}}\n"
	bRouterPub2 = "routers:\n  - {id: r1, project_id: t1, external_gateway_info: {network_id: pub2}}\n"
	bPorts      = `ports:
  - {id: r1-if, network_id: n1, mac_address: "fa:16:3e:00:00:01", device_owner: "network:router_interface", device_id: r1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.1}]}
  - {id: a2, network_id: n1, project_id: t1, mac_address: "fa:16:3e:00:00:20", device_owner: "compute:nova", device_id: vm-a2, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.20}]}
`
	bA1 = `  - {id: a1, network_id: n1, project_id: t1, mac_address: "fa:16:3e:00:00:10", device_owner: "compute:nova", device_id: vm-a1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.10}]}
`
	bB1 = `  - {id: b1, network_id: n2, project_id: t2, mac_address: "fa:16:3e:00:00:10", device_owner: "compute:nova", device_id: vm-b1, fixed_ips: [{subnet_id: s2, ip_address: 10.1.0.10}]}
`
	bA3 = `  - {id: a3, network_id: n1, project_id: t1, mac_address: "fa:16:3e:00:00:30", device_owner: "compute:nova", device_id: vm-a3, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.30}]}
`
	bBefore = bInvHead + bRouterPub + bPorts + bA1
)

// barrierOff runs TestSwapBarrier without the barrier (no WithExporter),
// to show that it fails then: TAPFLOW_TEST_SWAP_BARRIER=off.
var barrierOff = os.Getenv("TAPFLOW_TEST_SWAP_BARRIER") == "off"

// TestSwapBarrier: records of traffic that flowed before an inventory
// change but are still "in the kernel" when the engine swaps are
// attributed against the inventory they flowed under — a1's upload stays
// acme's when globex's b1 reuses its MAC, vm traffic stays labelled
// public when its router's gateway moves — while traffic after the swap
// gets the new one; a pure addition swaps without an export; a failed or
// blocked export swaps anyway within the bound, counted. Fails with
// TAPFLOW_TEST_SWAP_BARRIER=off.
func TestSwapBarrier(t *testing.T) {
	a1ToA2 := func(port int32) schemas.Flow {
		f := rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:20", "10.0.0.10", "10.0.0.20")
		f.SrcPort = port
		return f
	}
	a1ToNet := func(port int32) schemas.Flow {
		f := rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:01", "10.0.0.10", "8.8.8.8")
		f.SrcPort = port
		return f
	}
	type want struct {
		tenant, zone, exit string
	}
	cases := []struct {
		name     string
		after    string
		traffic  func(port int32) schemas.Flow
		gate     *gate
		fail     error
		bound    time.Duration
		before   want // the live record of traffic before the change
		after_   want // traffic after the swap
		result   string
		exports  int
		noBefore bool // the barrier cannot help: the record takes the new inventory
	}{
		{name: "mac reused by another project", after: bInvHead + bRouterPub + bPorts + bB1, traffic: a1ToA2,
			gate:   &gate{delay: 50 * time.Millisecond},
			before: want{"t1", "same_tenant", "none"}, after_: want{"t2", "other_tenant", "none"}, result: barrierOK, exports: 1},
		{name: "gateway moves", after: bInvHead + bRouterPub2 + bPorts + bA1, traffic: a1ToNet,
			gate:   &gate{delay: 50 * time.Millisecond},
			before: want{"t1", "external", "public"}, after_: want{"t1", "external", "public2"}, result: barrierOK, exports: 1},
		{name: "port removed: ghost attributes the same, no export", after: bInvHead + bRouterPub + bPorts, traffic: a1ToA2,
			before: want{"t1", "same_tenant", "none"}, after_: want{"t1", "same_tenant", "none"}, result: barrierSkipped, exports: 0},
		{name: "pure addition: no export", after: bBefore + bA3, traffic: a1ToNet,
			before: want{"t1", "external", "public"}, after_: want{"t1", "external", "public"}, result: barrierSkipped, exports: 0},
		{name: "export fails: swap anyway", after: bInvHead + bRouterPub2 + bPorts + bA1, traffic: a1ToNet, fail: errors.New("kernel says no"),
			before: want{"t1", "external", "public2"}, after_: want{"t1", "external", "public2"}, result: barrierError, exports: 1, noBefore: true},
		{name: "downstream blocked: swap at the bound", after: bInvHead + bRouterPub2 + bPorts + bA1, traffic: a1ToNet,
			gate: &gate{open: make(chan struct{})}, bound: 300 * time.Millisecond,
			before: want{"t1", "external", "public2"}, after_: want{"t1", "external", "public2"}, result: barrierTimeout, exports: 1, noBefore: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "inventory.yaml")
			write := func(s string) {
				t.Helper()
				if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(path+".tmp", path); err != nil {
					t.Fatal(err)
				}
			}
			write(bBefore)
			cfg := DefaultConfig()
			cfg.Inventory.File = path
			cfg.Inventory.PollInterval = units.Duration(100 * time.Millisecond)
			src := newKernelSource()
			src.fail = c.fail
			reg := prometheus.NewRegistry()
			var opts []Option
			if !barrierOff {
				opts = append(opts, WithExporter(src, c.bound))
			}
			e, err := New(cfg, slog.New(slog.DiscardHandler), reg, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range barrierResults {
				if v := testutil.ToFloat64(e.m.barriers.WithLabelValues(r)); v != 0 {
					t.Fatalf("swap_barriers_total{result=%q} = %v at start", r, v)
				}
			}
			ctx := context.Background()
			if err := e.Load(ctx); err != nil {
				t.Fatal(err)
			}
			transforms := []pipeline.Transform{e}
			if c.gate != nil {
				transforms = []pipeline.Transform{c.gate, e}
			}
			sink := &keepSink{}
			run, err := pipeline.NewRunner(pipeline.Config{Name: "t", EdgeCapacity: 4, ShutdownTimeout: 10 * time.Second},
				src, transforms, sink, pipeline.NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			pctx, stopPipe := context.WithCancel(ctx)
			pdone := make(chan error, 1)
			go func() { pdone <- run.Run(pctx) }()
			rctx, stopReload := context.WithCancel(ctx)
			rdone := make(chan error, 1)
			go func() { rdone <- e.Run(rctx) }()

			src.add(c.traffic(1)) // flowed before the change, still in the kernel
			write(c.after)
			start := time.Now()
			deadline := start.Add(30 * time.Second)
			for e.Snapshot().Version() < 2 {
				if time.Now().After(deadline) {
					t.Fatal("the new inventory was never swapped in")
				}
				time.Sleep(10 * time.Millisecond)
			}
			took := time.Since(start)
			if c.bound > 0 && took > c.bound+5*time.Second {
				t.Errorf("swap took %s with a %s bound", took, c.bound)
			}
			src.add(c.traffic(2)) // after the swap
			if c.gate != nil && c.gate.open != nil {
				close(c.gate.open)
			}
			stopReload()
			<-rdone
			stopPipe()
			if err := <-pdone; err != nil {
				t.Fatal(err)
			}

			for _, r := range barrierResults {
				want := 0.0
				if r == barrierSkipped {
					want++ // the first load: the empty snapshot knew no VM
				}
				if r == c.result {
					want++
				}
				if got := testutil.ToFloat64(e.m.barriers.WithLabelValues(r)); !barrierOff && got != want {
					t.Errorf("swap_barriers_total{result=%q} = %v, want %v", r, got, want)
				}
			}
			if !barrierOff && src.exports != c.exports {
				t.Errorf("%d exports, want %d", src.exports, c.exports)
			}
			got := map[int32]want{}
			for _, f := range sink.recs {
				got[f.SrcPort] = want{f.TenantID, f.Zone, f.ExternalNetwork}
			}
			if len(sink.recs) != 2 {
				t.Fatalf("%d records reached the sink, want 2: %+v", len(sink.recs), sink.recs)
			}
			if got[1] != c.before {
				t.Errorf("record of traffic before the change: %+v, want %+v", got[1], c.before)
			}
			if got[2] != c.after_ {
				t.Errorf("record of traffic after the swap: %+v, want %+v", got[2], c.after_)
			}
			t.Logf("swap after %s; before %+v, after %+v", took.Round(time.Millisecond), got[1], got[2])
		})
	}
}
