package nodeview_test

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
)

// The fleet measured: synth.Fleet (100,000 ports: 60,000 VMs, 20,000
// router interfaces, 20,000 DHCP ports, 100 load balancers) on 1,000
// compute nodes (60 VM ports each) and 10 network nodes.
const benchNodes = 1000

func fleet(tb testing.TB) *inventory.Inventory {
	tb.Helper()
	inv := synth.WithUUIDs(synth.Generate(synth.Fleet)) // real ids compress as badly as pseudonyms
	bind(inv, benchNodes)
	for i := range inv.Ports {
		if p := &inv.Ports[i]; p.BindingHostID == "net0" {
			p.BindingHostID = fmt.Sprintf("net%d", i%10)
		}
	}
	return inv
}

// encodeOverlay is an overlay as it travels.
func encodeOverlay(tb testing.TB, o *nodeview.Overlay) []byte {
	data, err := nodeview.Encode(o)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

func encoded(tb testing.TB, inv *inventory.Inventory) int {
	data, _, err := natsinv.Encode(natsinv.Normalize(inv))
	if err != nil {
		tb.Fatal(err)
	}
	return len(data)
}

// deltaBytes is what natsinv sends for prev → next: the changed objects,
// gob and zstd (the ids of deleted ones are left out: none here).
func deltaBytes(tb testing.TB, prev, next *inventory.Inventory) int {
	c := natsinv.Diff(natsinv.Normalize(prev), natsinv.Normalize(next))
	return encoded(tb, &c.Upsert)
}

// BenchmarkNodeViews is the service's cost of node-scoped views for
// the whole fleet (a first publish, or a restart): index the inventory,
// build the shared view and every node's overlay, encode them (as the
// service's Overlays does). It reports the bytes of the whole snapshot,
// the shared view and the overlays, and the heap the service keeps.
// Run: go test -run '^$' -bench BenchmarkNodeViews -benchtime 1x ./enrich/nodeview/
func BenchmarkNodeViews(b *testing.B) {
	inv := fleet(b)
	nb, err := nodeview.New(testKey)
	if err != nil {
		b.Fatal(err)
	}
	full := encoded(b, inv)
	b.ResetTimer()
	base := heap()
	cpu := cpuTime()
	var shared, sum, most, n, netSum, nets int
	var ov *nodeview.Overlays
	for range b.N {
		x := nb.NewIndex(inv)
		shared = encoded(b, x.Shared())
		sum, most, n, netSum, nets = 0, 0, 0, 0, 0
		ov = nodeview.NewOverlays() // as the service builds them: remembering each one's inputs
		ov.Update(x)
		for _, node := range ov.Nodes() {
			data, _, err := ov.Encoded(node)
			if err != nil {
				b.Fatal(err)
			}
			l := len(data)
			if strings.HasPrefix(node, "net") { // a network node: 4,000 router and DHCP ports
				netSum += l
				nets++
				continue
			}
			sum += l
			most = max(most, l)
			n++
		}
	}
	b.ReportMetric((cpuTime()-cpu).Seconds()/float64(b.N), "cpu_s/op")
	// what the service holds between changes: every overlay encoded
	// and the keys each was built from
	b.ReportMetric(float64(heap()-base)/1e6, "service_state_MB")
	runtime.KeepAlive(ov)
	b.ReportMetric(float64(full), "full_B")
	b.ReportMetric(float64(shared), "shared_B")
	b.ReportMetric(float64(sum/n), "compute_overlay_mean_B")
	b.ReportMetric(float64(most), "compute_overlay_max_B")
	b.ReportMetric(float64(netSum/max(nets, 1)), "network_overlay_mean_B")
	b.ReportMetric(float64(n), "compute_nodes")
}

// BenchmarkNodeViewChange is one inventory change (a VM with a floating
// IP boots on one compute node) under node-scoped views: the service
// indexes the new inventory, encodes the shared view and its delta, and
// sends the delta and the changed overlays. rebuild=all rebuilds every overlay to find the
// changed ones (before Overlays); rebuild=changed is the service's
// Overlays.Update, which rebuilds the overlays whose inputs changed. The
// bus bytes are compared with today's delta of the whole inventory, and
// whole_cpu_s is today's CPU for the change (normalize, diff, encode the
// whole inventory) in the same run.
// Run: go test -run '^$' -bench BenchmarkNodeViewChange -benchtime 1x ./enrich/nodeview/
func BenchmarkNodeViewChange(b *testing.B) {
	prev := fleet(b)
	nb, err := nodeview.New(testKey)
	if err != nil {
		b.Fatal(err)
	}
	next := *prev
	var tmpl inventory.Port // a VM port: the new VM sits on its network, on its node
	for _, p := range prev.Ports {
		if p.DeviceOwner == "compute:nova" && len(p.FixedIPs) == 1 {
			tmpl = p
			break
		}
	}
	vm := tmpl
	vm.ID, vm.DeviceID, vm.MACAddress = "2f1c7a52-0b7e-4c55-9d1e-0d6f3f3c9a01", "7d0e6a1b-33a4-4d2f-8a51-6b0c2e9f4d17", "fa:16:3e:ff:00:01"
	vm.FixedIPs = []inventory.FixedIP{{SubnetID: tmpl.FixedIPs[0].SubnetID, IPAddress: "10.0.7.200"}}
	next.Ports = append(slices.Clone(prev.Ports), vm)
	next.Servers = append(slices.Clone(prev.Servers), inventory.Server{ID: vm.DeviceID, Name: "new", ProjectID: vm.ProjectID})
	next.FloatingIPs = append(slices.Clone(prev.FloatingIPs), inventory.FloatingIP{ID: "c3e1b0f2-5a8d-4e61-b7c9-2d4f6a8e0b13", FloatingNetworkID: prev.FloatingIPs[0].FloatingNetworkID, PortID: vm.ID, ProjectID: vm.ProjectID})
	px := nb.NewIndex(prev)
	before := map[string]string{}
	for _, node := range px.Nodes() {
		before[node] = string(encodeOverlay(b, px.Overlay(node)))
	}
	// today's work for the change: the whole snapshot and its delta
	cpu0 := cpuTime()
	wholeDelta := deltaBytes(b, prev, &next)
	encoded(b, &next)
	wholeCPU := cpuTime() - cpu0
	report := func(b *testing.B, cpu time.Duration, rebuilt, changed, bus, sharedDelta int) {
		b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu_s/op")
		b.ReportMetric(float64(rebuilt), "overlays_rebuilt")
		b.ReportMetric(float64(changed), "overlays_changed")
		b.ReportMetric(float64(bus), "bus_B")
		b.ReportMetric(float64(sharedDelta), "shared_delta_B")
		b.ReportMetric(float64(wholeDelta), "whole_delta_B")
		b.ReportMetric(wholeCPU.Seconds(), "whole_cpu_s")
	}
	b.Run("rebuild=all", func(b *testing.B) {
		cpu := cpuTime()
		var changed, bus, sharedDelta, rebuilt int
		for range b.N {
			x := nb.NewIndex(&next)
			sharedDelta = deltaBytes(b, px.Shared(), x.Shared())
			encoded(b, x.Shared()) // the service publishes the shared snapshot too
			changed, bus, rebuilt = 0, sharedDelta, 0
			for _, node := range x.Nodes() {
				rebuilt++
				if e := encodeOverlay(b, x.Overlay(node)); string(e) != before[node] {
					changed++
					bus += len(e)
				}
			}
		}
		report(b, cpuTime()-cpu, rebuilt, changed, bus, sharedDelta)
	})
	b.Run("rebuild=changed", func(b *testing.B) {
		var cpu time.Duration
		var changed, bus, sharedDelta, rebuilt int
		for range b.N {
			b.StopTimer()
			ov := nodeview.NewOverlays() // the service's state before the change
			ov.Update(nb.NewIndex(prev))
			b.StartTimer()
			c0 := cpuTime()
			x := nb.NewIndex(&next)
			sharedDelta = deltaBytes(b, px.Shared(), x.Shared())
			encoded(b, x.Shared()) // the service publishes the shared snapshot too
			nodes, full := ov.Update(x)
			if full != "" {
				b.Fatalf("a boot rebuilt every overlay: %s", full)
			}
			changed, bus, rebuilt = 0, sharedDelta, len(nodes)
			for _, node := range nodes {
				if e, _, _ := ov.Encoded(node); string(e) != before[node] {
					changed++
					bus += len(e)
				}
			}
			cpu += cpuTime() - c0
		}
		report(b, cpu, rebuilt, changed, bus, sharedDelta)
	})
}

// BenchmarkNodeViewAgentMemory is what an agent holds: the decoded
// inventory and the snapshot built from it, whole and as one compute
// node's view (heap in use after a GC, per port of the cloud).
// Run: go test -run '^$' -bench BenchmarkNodeViewAgentMemory -benchtime 1x ./enrich/nodeview/
func BenchmarkNodeViewAgentMemory(b *testing.B) {
	inv := fleet(b)
	nb, err := nodeview.New(testKey)
	if err != nil {
		b.Fatal(err)
	}
	x := nb.NewIndex(inv)
	view := nodeview.Merge(x.Shared(), x.Overlay(x.Nodes()[0]))
	x = nil
	hold := func(v *inventory.Inventory) float64 {
		data, _, err := natsinv.Encode(natsinv.Normalize(v))
		if err != nil {
			b.Fatal(err)
		}
		base := heap()
		dec, err := natsinv.Decode(data)
		if err != nil {
			b.Fatal(err)
		}
		s := snapshot.Build(snapshot.Inputs(dec, true), snapshot.Options{Version: 1, Now: time.Unix(1_800_000_000, 0)})
		used := heap() - base
		runtime.KeepAlive(s)
		runtime.KeepAlive(dec)
		return float64(used) / float64(len(inv.Ports))
	}
	var whole, scoped float64
	for range b.N {
		hold(inv) // warm-up: the decoder's and gob's first-use buffers are nobody's cost
		scoped, whole = hold(view), hold(inv)
	}
	b.ReportMetric(whole, "whole_B/port")
	b.ReportMetric(scoped, "view_B/port")
}

// cpuTime is the process's user and system CPU time: the machine is
// shared, so wall time says little.
func cpuTime() time.Duration {
	var r syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

func heap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}
