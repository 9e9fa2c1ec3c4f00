//go:build linux

package capture

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/units"
)

// TestExportLive: three senders pinned to different CPUs keep 150 UDP
// flows busy (more flows than a 16-slot flow cache holds, so slots merge
// into the table while the cache generations flip) while ExportLive runs
// every 20 ms (at least 30 times, for at least 2 s). With timeouts of a minute, only the exports take records
// out of the kernel before the stop: after a last export the records
// equal the kernel meters, byte and packet exact, per tap and direction
// (so no byte was counted twice or left behind), most of them
// end_reason inventory_change; every flow was split (several records).
func TestExportLive(t *testing.T) {
	const senders, flowsEach, minExports = 3, 50, 30
	cpus := runtime.NumCPU()
	lab := nslab.New(t)
	dst := lab.AddVM(1, true)
	var vms []*nslab.VM
	for i := range senders {
		vms = append(vms, lab.AddVM(2+i, true))
	}
	cfg := labConfig(lab, attach.Auto)
	cfg.FlowCacheSlots = 16
	cfg.ActiveTimeout = units.Duration(time.Minute)
	cfg.IdleTimeout = units.Duration(time.Minute)
	r := start(t, cfg)
	if err := r.c.ExportLive(context.Background()); err != nil && !errors.Is(err, ErrNotRunning) {
		t.Fatalf("ExportLive before Run attached: %v", err)
	}
	waitFor(t, "4 attached taps", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 1+senders })
	listenUDP(t, dst, 9500)

	var wg sync.WaitGroup
	var stop atomic.Bool
	for i, vm := range vms {
		wg.Add(1)
		go func(cpu int, vm *nslab.VM) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu % cpus)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Errorf("pin sender to CPU %d: %v", cpu, err)
				return
			}
			for round := 0; !stop.Load(); round++ {
				for f := range flowsEach {
					if err := sendFlow(vm, 21000+f, dst.IP, 9500, 2, 200+round%500+f); err != nil {
						t.Errorf("flow %d from %s: %v", f, vm.Name, err)
						return
					}
				}
			}
		}(i, vm)
	}
	exports, began := 0, time.Now()
	for exports < minExports || time.Since(began) < 2*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := r.c.ExportLive(ctx)
		cancel()
		if err != nil {
			t.Fatalf("ExportLive during traffic: %v", err)
		}
		exports++
		time.Sleep(20 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	taps := []string{dst.Tap}
	for _, vm := range vms {
		taps = append(taps, vm.Tap)
	}
	// A last export takes everything out; the meters (every 200 ms)
	// catch up.
	if err := r.c.ExportLive(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "records equal to the meters after the last export", func() bool {
		rs, ms := r.col.recordSums(), r.col.meterSums()
		for _, tap := range taps {
			for _, d := range []string{"tx", "rx"} {
				k := tapDir{tap, d}
				if rs[k] != (sums{packets: ms[k].packets, bytes: ms[k].bytes}) {
					return false
				}
			}
		}
		return ms[tapDir{vms[0].Tap, "tx"}].packets > 0 && ms[tapDir{dst.Tap, "rx"}].packets > 0
	})
	r.col.mu.Lock()
	var change, other int
	perFlow := map[uint16]int{}
	for _, rec := range r.col.flows {
		if bpf.EndReason(rec.EndReason) == bpf.EndInventoryChange {
			change++
		} else {
			other++
		}
		if rec.Ifname == vms[0].Tap && rec.Key.DstPort == 9500 {
			perFlow[rec.Key.SrcPort]++
		}
	}
	r.col.mu.Unlock()
	split := 0
	for _, n := range perFlow {
		if n > 1 {
			split++
		}
	}
	t.Logf("%d exports; %d records inventory_change, %d other; %d of %d flows of %s in several records",
		exports, change, other, split, len(perFlow), vms[0].Tap)
	if change == 0 {
		t.Error("no record carries end_reason inventory_change")
	}
	if split < flowsEach/2 {
		t.Errorf("only %d of %d flows were split by the exports", split, len(perFlow))
	}
	if n := gauge(t, r.reg, "tapflow_capture_live_exports_total"); n != float64(exports+1) {
		t.Errorf("tapflow_capture_live_exports_total = %v, want %d", n, exports+1)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	checkConservation(t, r.col, false, taps...)
	if err := r.c.ExportLive(context.Background()); !errors.Is(err, ErrNotRunning) {
		t.Errorf("ExportLive after Run returned: %v, want ErrNotRunning", err)
	}
}
