//go:build linux

package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/audit"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
)

const (
	e2eTenant = "5d1b6f1e9c4a4f0e8f0f7a1b2c3d4e5f"
	tcpAB     = 4 << 20 // TCP payload a → b
	tcpBA     = 3 << 20 // TCP payload b → a
	udpSize   = 1200    // UDP payload per datagram
	udpCount  = 600     // datagrams each way
)

// tapDir is one tap and direction (from the VM's point of view).
type tapDir struct{ ifname, dir string }

// TestRunEBPFConservation runs `tapflow run` (runAll: agent with source
// ebpf → enrich → JetStream → collector → Parquet, flows and meters) over
// a namespace lab with real TCP and UDP traffic both ways between two VMs,
// then reads the Parquet flows and meters back: for every tap and
// direction Σ flow bytes and packets equal Σ meter bytes and packets, the
// kernel lost nothing, and payload ≤ bytes ≤ 1.15 × payload. Every flow is
// attributed from an inventory file built from the lab's MACs.
func TestRunEBPFConservation(t *testing.T) {
	lab := nslab.New(t) // skips unless root with iproute2
	a, b := lab.AddVM(1, true), lab.AddVM(2, true)

	dir := t.TempDir()
	s := transporttest.Run(t, "")
	cfg := testConfig(t, dir)
	cfg.Source = "ebpf"
	cfg.Capture.Interfaces = []string{lab.Glob()}
	cfg.Capture.MemoryBudget = 8 << 20
	cfg.Capture.MaxInterfaces = 8
	cfg.Capture.MeterInterval = units.Duration(250 * time.Millisecond)
	// Pinned, as shipped, in the host's mount namespace, but on a bpffs
	// instance of the test's own: the machine's /sys/fs/bpf/tapflow is
	// shared with everything else running here. The stop exports the
	// table while the programs stay attached (TestAgentStopShapes runs
	// the default path itself in every deployment shape).
	cfg.Capture.PinDir = filepath.Join(hostBPFFS(t), "tapflow")
	cfg.Inventory.File = writeLabInventory(t, dir, a, b)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	rt := newRT(t, s.JS)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runAll(ctx, cfg, rt) }()
	waitAttached(t, rt.reg, 2, done)
	interfaceLossAtZero(t, rt.reg, a.Tap, b.Tap) // before any traffic

	payload := runLabTraffic(t, a, b)
	time.Sleep(time.Second) // meter intervals without traffic: zero deltas still tile time
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("run did not stop within 2m")
	}

	flows := readRows[schemas.Flow](t, dir, "flows", func(f *schemas.Flow) int64 { return f.TimeEnd })
	meters := readRows[schemas.Meter](t, dir, "meters", func(m *schemas.Meter) int64 { return m.TimeEnd })
	noTempFiles(t, dir)

	type sums struct{ packets, bytes, lostPackets, lostBytes, records int64 }
	fs, ms := map[tapDir]*sums{}, map[tapDir]*sums{}
	get := func(m map[tapDir]*sums, k tapDir) *sums {
		if m[k] == nil {
			m[k] = &sums{}
		}
		return m[k]
	}
	vmOf := map[string]*nslab.VM{a.Tap: a, b.Tap: b}
	for _, f := range flows {
		k := tapDir{f.Ifname, f.Direction}
		s := get(fs, k)
		s.packets += f.Packets
		s.bytes += f.Bytes
		s.records++
		vm := vmOf[f.Ifname]
		if vm == nil || f.Node != cfg.Node || f.MetadataVersion == 0 {
			t.Errorf("flow record of an unknown tap or node: %+v", f)
			continue
		}
		if ip := net.ParseIP(f.DstIP); ip.IsMulticast() && f.Direction == "rx" {
			// The host bridge's own IGMP reports reach every tap: the VM
			// MAC is a group MAC, so no tenant (docs/attribution.md).
			if f.Zone != "multicast" {
				t.Errorf("multicast record in zone %q: %+v", f.Zone, f)
			}
			continue
		}
		if f.VMMAC != vm.MAC.String() || f.TenantID != e2eTenant || f.ServerID != "server-"+vm.Name ||
			f.PortID != "port-"+vm.Name || f.Zone != "same_tenant" {
			t.Errorf("flow record not attributed to its VM: %+v", f)
		}
	}
	lastEnd := map[tapDir]int64{}
	sort.Slice(meters, func(i, j int) bool { return meters[i].TimeEnd < meters[j].TimeEnd })
	for _, m := range meters {
		k := tapDir{m.Ifname, m.Direction}
		s := get(ms, k)
		s.packets += m.Packets
		s.bytes += m.Bytes
		s.lostPackets += m.LostPackets
		s.lostBytes += m.LostBytes
		s.records++
		if m.Node != cfg.Node || m.AgentID != cfg.Agent.ID || m.FailedUpdates != 0 {
			t.Errorf("meter record %+v", m)
		}
		if prev, ok := lastEnd[k]; ok && m.TimeStart != prev {
			t.Errorf("%v: meter interval starts at %d, previous ended at %d (deltas must tile time)", k, m.TimeStart, prev)
		}
		lastEnd[k] = m.TimeEnd
	}

	for _, k := range []tapDir{{a.Tap, "tx"}, {a.Tap, "rx"}, {b.Tap, "tx"}, {b.Tap, "rx"}} {
		f, m := get(fs, k), get(ms, k)
		p := payload[k]
		ratio := float64(m.bytes) / float64(p)
		t.Logf("%s/%s: flows %d records %d packets %d bytes; meters %d records %d packets %d bytes, lost %d/%d; payload %d; bytes/payload %.4f",
			k.ifname, k.dir, f.records, f.packets, f.bytes, m.records, m.packets, m.bytes, m.lostPackets, m.lostBytes, p, ratio)
		if f.packets != m.packets || f.bytes != m.bytes {
			t.Errorf("%s/%s: Σ flows %d packets / %d bytes != Σ meters %d / %d", k.ifname, k.dir, f.packets, f.bytes, m.packets, m.bytes)
		}
		if m.lostPackets != 0 || m.lostBytes != 0 {
			t.Errorf("%s/%s: kernel lost %d packets / %d bytes", k.ifname, k.dir, m.lostPackets, m.lostBytes)
		}
		if m.bytes < p || float64(m.bytes) > 1.15*float64(p) {
			t.Errorf("%s/%s: %d bytes for %d bytes of payload; want payload ≤ bytes ≤ 1.15 × payload", k.ifname, k.dir, m.bytes, p)
		}
		if m.records < 2 {
			t.Errorf("%s/%s: %d meter records; want one per interval (several)", k.ifname, k.dir, m.records)
		}
	}
	for k := range fs {
		if _, ok := ms[k]; !ok {
			t.Errorf("flows on %v without any meter record", k)
		}
	}
	auditRealOutput(t, dir, cfg.Node)
}

// auditRealOutput runs tapflow audit's check on a real run's output: it
// passes; with one flow file of its last hour removed it fails, naming the
// node and that hour.
func auditRealOutput(t *testing.T, dir, node string) {
	t.Helper()
	ctx := context.Background()
	out, err := dataset.Open(ctx, dir, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := audit.Run(ctx, out, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = r.Print(&b, true)
	t.Logf("tapflow audit on the run's output:\n%s", b.String())
	if !r.OK() || r.FlowRecords == 0 || r.MeterRecords == 0 {
		t.Fatalf("audit of a real run fails")
	}
	// Tamper: remove a flow file of the last hour.
	last := r.Hours[len(r.Hours)-1].Hour
	part := filepath.Join(dir, "flows", last.Format("dt=2006-01-02"), last.Format("hour=15"))
	files, _ := filepath.Glob(filepath.Join(part, "*.parquet"))
	if len(files) == 0 {
		t.Fatalf("no flow file in %s", part)
	}
	if err := os.Remove(files[0]); err != nil {
		t.Fatal(err)
	}
	r, err = audit.Run(ctx, out, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	_ = r.Print(&b, false)
	t.Logf("tapflow audit with %s removed:\n%s", files[0], b.String())
	want := fmt.Sprintf(" hour %s: flows ", last.Format("2006-01-02T15Z"))
	if r.OK() || !strings.Contains(b.String(), "MISMATCH node "+node+" tap ") || !strings.Contains(b.String(), want) {
		t.Fatalf("audit of the tampered output: want %q", want)
	}
}

// waitAttached waits until the capture reports n attached interfaces.
func waitAttached(t *testing.T, reg prometheus.Gatherer, n float64, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "tapflow_capture_attached_interfaces" && mf.GetMetric()[0].GetGauge().GetValue() == n {
				return
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run stopped before the taps were attached: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v taps not attached within 20s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runLabTraffic sends TCP both ways on one connection and paced UDP both
// ways, and returns the payload that crossed each tap and direction, as
// counted by the receiving application.
func runLabTraffic(t *testing.T, a, b *nslab.VM) map[tapDir]int64 {
	t.Helper()
	var ln net.Listener
	if err := b.Do(func() (err error) { ln, err = net.Listen("tcp4", b.IP.String()+":7100"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var ua, ub net.PacketConn
	if err := a.Do(func() (err error) { ua, err = net.ListenPacket("udp4", a.IP.String()+":7201"); return }); err != nil {
		t.Fatal(err)
	}
	defer ua.Close()
	if err := b.Do(func() (err error) { ub, err = net.ListenPacket("udp4", b.IP.String()+":7200"); return }); err != nil {
		t.Fatal(err)
	}
	defer ub.Close()

	var wg sync.WaitGroup
	var gotAB, gotBA, udpGotAB, udpGotBA int64
	errs := make(chan error, 8)
	// b: accept, read everything a sends, send tcpBA back.
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			errs <- err
			return
		}
		defer c.Close()
		var rw sync.WaitGroup
		rw.Add(1)
		go func() { defer rw.Done(); gotAB, _ = io.Copy(io.Discard, c) }()
		if _, err := c.Write(make([]byte, tcpBA)); err != nil {
			errs <- fmt.Errorf("b write: %w", err)
		}
		c.(*net.TCPConn).CloseWrite()
		rw.Wait()
	}()
	var c net.Conn
	if err := a.Do(func() (err error) { c, err = net.Dial("tcp4", b.IP.String()+":7100"); return }); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer c.Close()
		var rw sync.WaitGroup
		rw.Add(1)
		go func() { defer rw.Done(); gotBA, _ = io.Copy(io.Discard, c) }()
		if _, err := c.Write(make([]byte, tcpAB)); err != nil {
			errs <- fmt.Errorf("a write: %w", err)
		}
		c.(*net.TCPConn).CloseWrite()
		rw.Wait()
	}()

	// UDP both ways, paced so no queue between the taps overflows.
	recv := func(pc net.PacketConn, n *int64) {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			*n += int64(k)
			if *n >= udpSize*udpCount {
				return
			}
		}
	}
	wg.Add(2)
	go recv(ub, &udpGotAB)
	go recv(ua, &udpGotBA)
	send := func(from net.PacketConn, to *nslab.VM, port int) {
		dst := &net.UDPAddr{IP: to.IP, Port: port}
		msg := make([]byte, udpSize)
		for i := range udpCount {
			if _, err := from.WriteTo(msg, dst); err != nil {
				errs <- err
				return
			}
			if i%20 == 19 {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
	var sw sync.WaitGroup
	sw.Add(2)
	go func() { defer sw.Done(); send(ua, b, 7200) }()
	go func() { defer sw.Done(); send(ub, a, 7201) }()
	sw.Wait()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if gotAB != tcpAB || gotBA != tcpBA {
		t.Fatalf("TCP delivered %d / %d bytes, want %d / %d", gotAB, gotBA, tcpAB, tcpBA)
	}
	if udpGotAB != udpSize*udpCount || udpGotBA != udpSize*udpCount {
		t.Logf("UDP delivered %d / %d of %d bytes each way (payload counts what arrived)", udpGotAB, udpGotBA, udpSize*udpCount)
	}
	ab, ba := gotAB+udpGotAB, gotBA+udpGotBA
	return map[tapDir]int64{
		{a.Tap, "tx"}: ab, {b.Tap, "rx"}: ab,
		{b.Tap, "tx"}: ba, {a.Tap, "rx"}: ba,
	}
}

// writeLabInventory writes an inventory file (docs/inventory.md) with one
// project, network and subnet and a Nova port and server per VM.
func writeLabInventory(t *testing.T, dir string, vms ...*nslab.VM) string {
	t.Helper()
	p := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(p, []byte(nslab.Inventory(e2eTenant, vms...)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// readRows returns every committed row of one schema under dir/sub,
// checking each file sits in the hour partition of its rows.
func readRows[T any](t *testing.T, dir, sub string, timeEnd func(*T) int64) []T {
	t.Helper()
	var all []T
	err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name()[0] == '.' {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, _ := f.Stat()
		rows, err := pq.Read[T](f, st.Size())
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		for i := range rows {
			hour := time.UnixMicro(timeEnd(&rows[i])).UTC().Format("dt=2006-01-02/hour=15")
			if rel, _ := filepath.Rel(filepath.Join(dir, sub), filepath.Dir(p)); rel != hour {
				t.Errorf("%s holds a row of %s", p, hour)
				break
			}
		}
		all = append(all, rows...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatalf("no %s rows under %s", sub, dir)
	}
	return all
}
