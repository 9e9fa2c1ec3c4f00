//go:build linux

package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/bpf/attach"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/units"
	"golang.org/x/sys/unix"
)

// tlog sends log lines to the test log.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) { w.t.Log(string(bytes.TrimSpace(p))); return len(p), nil }

// collector is a Handler that keeps everything.
type collector struct {
	mu     sync.Mutex
	flows  []Record
	meters []MeterRecord
}

func (c *collector) Flows(_ context.Context, recs []Record, done func()) error {
	c.mu.Lock()
	c.flows = append(c.flows, recs...)
	c.mu.Unlock()
	done()
	return nil
}

func (c *collector) Meters(_ context.Context, ms []MeterRecord, done func()) error {
	c.mu.Lock()
	c.meters = append(c.meters, ms...)
	c.mu.Unlock()
	done()
	return nil
}

type tapDir struct{ ifname, dir string }

type sums struct{ packets, bytes, lostP, lostB int64 }

func (c *collector) recordSums() map[tapDir]sums {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[tapDir]sums{}
	for _, r := range c.flows {
		k := tapDir{r.Ifname, bpf.Direction(r.Key.Direction).String()}
		s := out[k]
		s.packets += int64(r.Val.Packets)
		s.bytes += int64(r.Val.Bytes)
		out[k] = s
	}
	return out
}

func (c *collector) meterSums() map[tapDir]sums {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[tapDir]sums{}
	for _, m := range c.meters {
		k := tapDir{m.Ifname, m.Direction}
		s := out[k]
		s.packets += m.Packets
		s.bytes += m.Bytes
		s.lostP += m.LostPackets
		s.lostB += m.LostBytes
		out[k] = s
	}
	return out
}

// flowBytes sums records of one tap/direction/protocol/port pair.
func (c *collector) flowBytes(ifname string, dir bpf.Direction, proto uint8, sport, dport uint16) (packets, byts int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.flows {
		k := r.Key
		if r.Ifname == ifname && bpf.Direction(k.Direction) == dir && k.Protocol == proto && k.SrcPort == sport && k.DstPort == dport {
			packets += int64(r.Val.Packets)
			byts += int64(r.Val.Bytes)
		}
	}
	return
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += value(m)
			}
			return sum
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.Counter.GetValue()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type running struct {
	c    *Capture
	col  *collector
	reg  *prometheus.Registry
	stop func() error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	col := &collector{}
	reg := prometheus.NewRegistry()
	c, err := New(cfg, Options{Handler: col, Registry: reg, Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-errc:
			case <-time.After(20 * time.Second):
				runErr = errors.New("Run did not return within 20s of cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return &running{c: c, col: col, reg: reg, stop: stop}
}

func labConfig(lab *nslab.Lab, mode attach.Mode) Config {
	cfg := DefaultConfig()
	cfg.Interfaces = []string{lab.Glob()}
	cfg.MemoryBudget = 8 << 20
	cfg.MaxInterfaces = 16
	cfg.AttachMode = mode
	// Not pinned: these tests are about counting and exporting; the
	// pinned ones (restart_test.go) set a bpffs of their own, as the
	// machine's /sys/fs/bpf is shared with everything running here.
	cfg.PinDir = ""
	cfg.MeterInterval = units.Duration(200 * time.Millisecond)
	cfg.RescanInterval = units.Duration(500 * time.Millisecond)
	return cfg
}

// sendUDP sends n datagrams of size payload from vm to dst:port and returns
// the local port.
func sendUDP(t *testing.T, from *nslab.VM, dst net.IP, port, n, payload int) uint16 {
	t.Helper()
	var conn *net.UDPConn
	err := from.Do(func() (err error) {
		conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: dst, Port: port})
		return err
	})
	if err != nil {
		t.Fatalf("dial udp: %v", err)
	}
	defer conn.Close()
	buf := bytes.Repeat([]byte{0xab}, payload)
	for i := 0; i < n; i++ {
		if _, err := conn.Write(buf); err != nil {
			t.Fatalf("udp write: %v", err)
		}
		if i%64 == 63 {
			time.Sleep(time.Millisecond) // stay under the receiver's buffer
		}
	}
	return uint16(conn.LocalAddr().(*net.UDPAddr).Port)
}

// sendFlow sends n datagrams from local port sport (one flow); usable off
// the test goroutine.
func sendFlow(from *nslab.VM, sport int, dst net.IP, port, n, payload int) error {
	var conn *net.UDPConn
	if err := from.Do(func() (err error) {
		conn, err = net.DialUDP("udp4", &net.UDPAddr{Port: sport}, &net.UDPAddr{IP: dst, Port: port})
		return err
	}); err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, payload)
	for i := 0; i < n; i++ {
		if _, err := conn.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

// listenUDP discards datagrams in vm's namespace.
// listenUDP receives datagrams on port in vm and counts them.
func listenUDP(t *testing.T, vm *nslab.VM, port int) *atomic.Int64 {
	t.Helper()
	got := new(atomic.Int64)
	var pc net.PacketConn
	if err := vm.Do(func() (err error) { pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port)); return }); err != nil {
		t.Fatalf("listen udp: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 65536)
		for {
			if _, _, err := pc.ReadFrom(b); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	return got
}

// tcpExchange: client in a sends up bytes to b, b answers down bytes, both
// close. Returns the client port.
func tcpExchange(t *testing.T, a, b *nslab.VM, port, up, down int) uint16 {
	t.Helper()
	var ln net.Listener
	if err := b.Do(func() (err error) { ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port)); return }); err != nil {
		t.Fatalf("listen tcp: %v", err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		if _, err := io.CopyN(io.Discard, c, int64(up)); err != nil {
			srvErr <- err
			return
		}
		_, err = c.Write(bytes.Repeat([]byte{1}, down))
		srvErr <- err
	}()
	var conn net.Conn
	if err := a.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", b.IP, port), 5*time.Second)
		return
	}); err != nil {
		t.Fatalf("dial tcp: %v", err)
	}
	if _, err := conn.Write(bytes.Repeat([]byte{2}, up)); err != nil {
		t.Fatalf("tcp write: %v", err)
	}
	if _, err := io.CopyN(io.Discard, conn, int64(down)); err != nil {
		t.Fatalf("tcp read: %v", err)
	}
	lport := uint16(conn.LocalAddr().(*net.TCPAddr).Port)
	conn.Close()
	if err := <-srvErr; err != nil {
		t.Fatalf("tcp server: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // let the FIN/ACKs cross
	return lport
}

func checkConservation(t *testing.T, col *collector, requireTraffic bool, taps ...string) {
	t.Helper()
	rs, ms := col.recordSums(), col.meterSums()
	for _, tap := range taps {
		for _, d := range []string{"tx", "rx"} {
			k := tapDir{tap, d}
			r, m := rs[k], ms[k]
			if m.lostP != 0 || m.lostB != 0 {
				t.Errorf("%s/%s: kernel lost %d packets %d bytes", tap, d, m.lostP, m.lostB)
			}
			if r.bytes != m.bytes-m.lostB || r.packets != m.packets-m.lostP {
				t.Errorf("%s/%s: Σ records %d packets %d bytes != meter %d packets %d bytes", tap, d, r.packets, r.bytes, m.packets, m.bytes)
			}
			if requireTraffic && m.bytes == 0 {
				t.Errorf("%s/%s: no traffic metered", tap, d)
			}
			t.Logf("%s/%s: records %d pkts %d B, meter %d pkts %d B", tap, d, r.packets, r.bytes, m.packets, m.bytes)
		}
	}
}

// TestRealTraffic: two VMs on a bridge, UDP and TCP of known size both ways;
// Σ record bytes per tap and direction equals the kernel meter, nothing is
// lost, and each flow's bytes are within [payload, 1.15 × payload].
func TestRealTraffic(t *testing.T) {
	for _, mode := range []attach.Mode{attach.TCX, attach.TC} {
		t.Run(string(mode), func(t *testing.T) {
			lab := nslab.New(t)
			a, b := lab.AddVM(1, true), lab.AddVM(2, true)
			r := start(t, labConfig(lab, mode))
			waitFor(t, "2 attached taps", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 2 })

			const n, payload = 500, 1000
			listenUDP(t, b, 9000)
			listenUDP(t, a, 9001)
			pAB := sendUDP(t, a, b.IP, 9000, n, payload)
			pBA := sendUDP(t, b, a.IP, 9001, n/2, 1400) // fits the 1500 MTU: no fragments
			const up, down = 3 << 20, 1 << 20
			cport := tcpExchange(t, a, b, 9100, up, down)
			time.Sleep(100 * time.Millisecond)
			if err := r.stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			checkConservation(t, r.col, true, a.Tap, b.Tap)
			for _, c := range []struct {
				name       string
				tap        string
				dir        bpf.Direction
				proto      uint8
				sport, dp  uint16
				wantP      int64
				payloadSum int64
			}{
				{"udp a→b at a (tx)", a.Tap, bpf.DirTX, 17, pAB, 9000, n, n * payload},
				{"udp a→b at b (rx)", b.Tap, bpf.DirRX, 17, pAB, 9000, n, n * payload},
				{"udp b→a at b (tx)", b.Tap, bpf.DirTX, 17, pBA, 9001, n / 2, n / 2 * 1400},
				{"udp b→a at a (rx)", a.Tap, bpf.DirRX, 17, pBA, 9001, n / 2, n / 2 * 1400},
				{"tcp upload at a (tx)", a.Tap, bpf.DirTX, 6, cport, 9100, -1, up},
				{"tcp upload at b (rx)", b.Tap, bpf.DirRX, 6, cport, 9100, -1, up},
				{"tcp download at b (tx)", b.Tap, bpf.DirTX, 6, 9100, cport, -1, down},
				{"tcp download at a (rx)", a.Tap, bpf.DirRX, 6, 9100, cport, -1, down},
			} {
				p, by := r.col.flowBytes(c.tap, c.dir, c.proto, c.sport, c.dp)
				if c.wantP >= 0 && p != c.wantP {
					t.Errorf("%s: %d packets, want %d", c.name, p, c.wantP)
				}
				if by < c.payloadSum || float64(by) > 1.15*float64(c.payloadSum) {
					t.Errorf("%s: %d bytes for %d payload bytes (want within [1, 1.15]×)", c.name, by, c.payloadSum)
				}
			}
			var fin int
			for _, rec := range r.col.flows {
				if bpf.EndReason(rec.EndReason) == bpf.EndFIN {
					fin++
				}
			}
			if fin == 0 {
				t.Errorf("no fin records from a closed TCP connection")
			}
		})
	}
}

// TestCacheFlipUnderLoad: senders pinned to different CPUs push 4,000
// distinct flows (125× a 16-slot per-CPU flow cache, several packets each)
// while sweeps flip the cache generations every 100 ms. Before shutdown,
// the idle sweeps alone must have exported every metered byte (nothing
// stuck in a cache), and the records add up to the kernel meters, byte and
// packet exact, nothing lost.
func TestCacheFlipUnderLoad(t *testing.T) {
	const slots, flows, pkts = 16, 4000, 3
	cpus := runtime.NumCPU()
	lab := nslab.New(t)
	vms := []*nslab.VM{lab.AddVM(1, true), lab.AddVM(2, true), lab.AddVM(3, true)}
	cfg := labConfig(lab, attach.Auto)
	cfg.FlowCacheSlots = slots
	cfg.IdleTimeout = units.Duration(time.Second)
	cfg.SweepInterval = units.Duration(100 * time.Millisecond)
	r := start(t, cfg)
	waitFor(t, "3 attached taps", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 3 })
	dst := vms[0]
	listenUDP(t, dst, 9400)
	var wg sync.WaitGroup
	for i, vm := range vms[1:] {
		wg.Add(1)
		go func(cpu int, vm *nslab.VM) {
			defer wg.Done()
			// The tap's ingress program runs on the sending CPU.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(cpu % cpus)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				t.Errorf("pin sender to CPU %d: %v", cpu, err)
				return
			}
			for f := 0; f < flows/2; f++ {
				if err := sendFlow(vm, 20000+f, dst.IP, 9400, pkts, 100+f%500); err != nil {
					t.Errorf("flow %d from %s: %v", f, vm.Name, err)
					return
				}
			}
		}(i, vm)
	}
	wg.Wait()
	taps := []string{vms[0].Tap, vms[1].Tap, vms[2].Tap}
	waitFor(t, "idle sweeps export every metered byte", func() bool {
		rs, ms := r.col.recordSums(), r.col.meterSums()
		for _, tap := range taps {
			for _, d := range []string{"tx", "rx"} {
				k := tapDir{tap, d}
				if rs[k].bytes != ms[k].bytes || rs[k].packets != ms[k].packets {
					return false
				}
			}
		}
		return ms[tapDir{vms[1].Tap, "tx"}].packets >= flows/2*pkts
	})
	// Flows left the caches through sweeps (merges), not only through
	// conflicts on the packet path.
	if n := gauge(t, r.reg, "tapflow_capture_flow_cache_merged_total"); n == 0 {
		t.Error("no sweep merged a cache slot")
	}
	// Bursts of a few flows: the caches pay, no CPU bypasses them.
	if n := gauge(t, r.reg, "tapflow_capture_flow_cache_bypasses_total"); n != 0 {
		t.Errorf("tapflow_capture_flow_cache_bypasses_total = %v with bursts of few flows, want 0", n)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	checkConservation(t, r.col, false, taps...)
	for _, vm := range vms[1:] {
		ports := map[uint16]bool{}
		r.col.mu.Lock()
		for _, rec := range r.col.flows {
			if rec.Ifname == vm.Tap && bpf.Direction(rec.Key.Direction) == bpf.DirTX && rec.Key.DstPort == 9400 {
				ports[rec.Key.SrcPort] = true
			}
		}
		r.col.mu.Unlock()
		if len(ports) != flows/2 {
			t.Errorf("%s: records of %d flows, %d sent", vm.Tap, len(ports), flows/2)
		}
	}
}

// TestTinyTable: a flow table of 2 entries still conserves every byte;
// the excess leaves as overflow records.
func TestTinyTable(t *testing.T) {
	lab := nslab.New(t)
	a, b := lab.AddVM(1, true), lab.AddVM(2, true)
	cfg := labConfig(lab, attach.Auto)
	cfg.FlowTableEntries = 2
	r := start(t, cfg)
	waitFor(t, "2 attached taps", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 2 })
	for p := 0; p < 20; p++ {
		listenUDP(t, b, 9200+p)
		sendUDP(t, a, b.IP, 9200+p, 10, 200)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	checkConservation(t, r.col, false, a.Tap, b.Tap)
	var overflow int
	for _, rec := range r.col.flows {
		if bpf.EndReason(rec.EndReason) == bpf.EndOverflow {
			overflow++
		}
	}
	if overflow == 0 {
		t.Fatal("no overflow records with a 2-entry table")
	}
}

// TestInterfaceChurn: a tap added while running is captured; one removed is
// released; the names of flows survive their tap.
func TestInterfaceChurn(t *testing.T) {
	lab := nslab.New(t)
	a := lab.AddVM(1, true)
	r := start(t, labConfig(lab, attach.Auto))
	waitFor(t, "1 attached tap", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 1 })
	b := lab.AddVM(2, true)
	waitFor(t, "the new tap attached", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 2 })
	got := listenUDP(t, a, 9300)
	pb := sendUDP(t, b, a.IP, 9300, 50, 500)
	// Remove the tap only once every datagram crossed it (ARP resolution
	// can hold the first ones back on a loaded machine).
	waitFor(t, "50 datagrams delivered", func() bool { return got.Load() == 50 })
	lab.RemoveVM(b)
	waitFor(t, "the removed tap released", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 1 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.col.flowBytes(b.Tap, bpf.DirTX, 17, pb, 9300); p != 50 {
		t.Fatalf("removed tap's flow: %d packets under its name, want 50", p)
	}
	checkConservation(t, r.col, false, a.Tap, b.Tap)
}

// TestCacheBypassCounted: one packet each of 3,000 flows sent from one
// CPU: its flow cache counts none of them twice, so that CPU bypasses the
// cache (bpf.TestCacheBypass has the rule), tapflow_capture_flow_cache_bypasses_total
// counts it at a sweep, and the records still add up to the meters.
func TestCacheBypassCounted(t *testing.T) {
	const flows = 3000
	lab := nslab.New(t)
	src, dst := lab.AddVM(1, true), lab.AddVM(2, true)
	cfg := labConfig(lab, attach.Auto)
	// Sweeps (which count the bypasses) and idle exports within waitFor's
	// 10 s; the defaults (sweep every 5 s, idle after 15 s) would not.
	cfg.IdleTimeout = units.Duration(time.Second)
	cfg.SweepInterval = units.Duration(100 * time.Millisecond)
	r := start(t, cfg)
	waitFor(t, "2 attached taps", func() bool { return gauge(t, r.reg, "tapflow_capture_attached_interfaces") == 2 })
	if n := gauge(t, r.reg, "tapflow_capture_flow_cache_bypasses_total"); n != 0 {
		t.Fatalf("%v bypasses before any traffic", n)
	}
	listenUDP(t, dst, 9400)
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var old, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			t.Fatal(err)
		}
		one.Set(0)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			t.Fatalf("pin sender to CPU 0: %v", err)
		}
		defer unix.SchedSetaffinity(0, &old)
		for f := range flows {
			if err := sendFlow(src, 20000+f, dst.IP, 9400, 1, 100); err != nil {
				t.Fatalf("flow %d: %v", f, err)
			}
		}
	}()
	waitFor(t, "a cache bypass counted", func() bool { return gauge(t, r.reg, "tapflow_capture_flow_cache_bypasses_total") >= 1 })
	waitFor(t, "idle sweeps export every metered byte", func() bool {
		rs, ms := r.col.recordSums(), r.col.meterSums()
		for _, tap := range []string{src.Tap, dst.Tap} {
			for _, d := range []string{"tx", "rx"} {
				k := tapDir{tap, d}
				if rs[k].bytes != ms[k].bytes || rs[k].packets != ms[k].packets {
					return false
				}
			}
		}
		return ms[tapDir{src.Tap, "tx"}].packets >= flows
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}
