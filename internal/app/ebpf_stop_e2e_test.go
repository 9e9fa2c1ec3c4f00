//go:build linux

package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tapflow/tapflow/bpf"
	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/schemas"
)

var (
	stopBinOnce sync.Once
	stopBin     string
	stopBinErr  error
)

// tapflowBin builds cmd/tapflow once per test binary: the deployment
// shapes below run the real command in namespaces of their own.
func tapflowBin(t *testing.T) string {
	t.Helper()
	stopBinOnce.Do(func() {
		root, err := versitygw.RepoRoot()
		if err != nil {
			stopBinErr = err
			return
		}
		dir, err := os.MkdirTemp("", "tapflow-stop-bin-")
		if err != nil {
			stopBinErr = err
			return
		}
		stopBin, stopBinErr = chaos.BuildTapflow(root, dir)
	})
	if stopBinErr != nil {
		t.Fatal(stopBinErr)
	}
	return stopBin
}

// hostBPFFS mounts a bpffs instance in the test's (the host's, initial)
// mount namespace, standing for the host's /sys/fs/bpf: the machine's own
// /sys/fs/bpf is shared with everything else running on it. Cleanup
// removes what is pinned (detaching the programs) and unmounts.
func hostBPFFS(t *testing.T) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "host-bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if _, err := bpf.RemovePinned(filepath.Join(mnt, "tapflow")); err != nil {
			t.Errorf("remove pinned state: %v", err)
		}
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	return mnt
}

// shape is how the agent is started: argv wraps `tapflow run --config`.
type shape struct {
	name string
	// wrap returns the command line that runs argv in the shape's
	// namespaces.
	wrap func(argv []string) []string
	// pinDir overrides capture.pin_dir ("" keeps the shipped default).
	pinDir string
	// durable: the pin outlives the agent (tapflow_capture_pin_durable).
	durable bool
	// restart: stop, traffic with no agent, start again (adopts), stop.
	restart bool
}

// agentProc is one `tapflow run` process.
type agentProc struct {
	cmd     *exec.Cmd
	log     string
	metrics string
	done    chan struct{} // closed when the process exited
	err     error         // its exit status, once done is closed
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startAgent runs tapflow in the shape with config cfg and waits until it
// logged both taps attached.
func startAgent(t *testing.T, sh shape, cfg, logPath string, taps ...string) *agentProc {
	t.Helper()
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(strings.SplitN(strings.SplitN(string(raw), "listen: ", 2)[1], "\n", 2)[0])
	argv := sh.wrap([]string{tapflowBin(t), "run", "--config", cfg})
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	st, _ := logf.Stat()
	skip := st.Size()
	p := &agentProc{log: logPath, metrics: "http://" + addr, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := 0
		for _, e := range logEntries(t, logPath, skip) {
			for _, tap := range taps {
				if e["msg"] == "attached" && e["ifname"] == tap {
					got++
				}
			}
		}
		if got >= len(taps) {
			return p
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s: tapflow exited before attaching: %v\n%s", sh.name, p.err, b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: taps not attached within 60s", sh.name)
		}
	}
}

// logEntries parses the JSON log lines after offset skip.
func logEntries(t *testing.T, path string, skip int64) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(skip, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// metricValue finds "name value" in a /metrics body.
func metricValue(t *testing.T, body, name string) string {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	t.Fatalf("metric %s missing from /metrics", name)
	return ""
}

// stop sends SIGINT and waits for a clean exit.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		if p.err != nil {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("tapflow run: %v\n%s", p.err, tailLines(string(b), 30))
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("tapflow run did not stop within 2m of SIGINT")
	}
	for _, e := range logEntries(t, p.log, 0) {
		if strings.Contains(fmt.Sprint(e["msg"]), "left behind at stop") {
			t.Errorf("the stop stranded records: %v", e)
		}
	}
}

func tailLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

// trickle sends paced UDP from a to b until stop is closed: traffic in
// flight while the agent stops.
func trickle(t *testing.T, a, b *nslab.VM, port int) (stop func()) {
	t.Helper()
	var pc net.PacketConn
	if err := b.Do(func() (err error) { pc, err = net.ListenPacket("udp4", fmt.Sprintf("%s:%d", b.IP, port)); return }); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, readerOf(pc))
	var out net.PacketConn
	if err := a.Do(func() (err error) { out, err = net.ListenPacket("udp4", a.IP.String()+":0"); return }); err != nil {
		t.Fatal(err)
	}
	var halt atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		msg := make([]byte, 700)
		dst := &net.UDPAddr{IP: b.IP, Port: port}
		for !halt.Load() {
			out.WriteTo(msg, dst)
			time.Sleep(time.Millisecond)
		}
	}()
	return func() {
		halt.Store(true)
		<-done
		out.Close()
		pc.Close()
	}
}

type pcReader struct{ pc net.PacketConn }

func (r pcReader) Read(b []byte) (int, error) { n, _, err := r.pc.ReadFrom(b); return n, err }

func readerOf(pc net.PacketConn) io.Reader { return pcReader{pc} }

// conserved reads the Parquet output and compares, per tap and direction,
// Σ flow bytes and packets with Σ meter bytes and packets (the kernel's
// count): they must be equal, with nothing lost in the kernel. It logs
// one table row per tap and direction.
func conserved(t *testing.T, dir, when string, taps ...string) {
	t.Helper()
	flows := readRows[schemas.Flow](t, dir, "flows", func(f *schemas.Flow) int64 { return f.TimeEnd })
	meters := readRows[schemas.Meter](t, dir, "meters", func(m *schemas.Meter) int64 { return m.TimeEnd })
	type sums struct{ fb, fp, mb, mp, lost int64 }
	s := map[tapDir]*sums{}
	for _, tap := range taps {
		for _, d := range []string{"tx", "rx"} {
			s[tapDir{tap, d}] = &sums{}
		}
	}
	for _, f := range flows {
		if x := s[tapDir{f.Ifname, f.Direction}]; x != nil {
			x.fb += f.Bytes
			x.fp += f.Packets
		}
	}
	for _, m := range meters {
		if x := s[tapDir{m.Ifname, m.Direction}]; x != nil {
			x.mb += m.Bytes
			x.mp += m.Packets
			x.lost += m.LostBytes
		}
	}
	for _, tap := range taps {
		for _, d := range []string{"tx", "rx"} {
			x := s[tapDir{tap, d}]
			t.Logf("| %s | %s | %s/%s | %d | %d | %+d |", t.Name(), when, tap, d, x.fb, x.mb, x.fb-x.mb)
			if x.fb != x.mb || x.fp != x.mp || x.lost != 0 {
				t.Errorf("%s: %s/%s: Parquet flows %d B / %d pkts, kernel meters %d B / %d pkts (lost %d B): %+d B",
					when, tap, d, x.fb, x.fp, x.mb, x.mp, x.lost, x.fb-x.mb)
			}
			if x.mb == 0 {
				t.Errorf("%s: %s/%s: no traffic metered", when, tap, d)
			}
		}
	}
}

// auditExact runs `tapflow audit --settle 0` on the output: exit 0.
func auditExact(t *testing.T, dir string) {
	t.Helper()
	out, err := exec.Command(tapflowBin(t), "audit", "--data", dir, "--settle", "0").CombinedOutput()
	t.Logf("tapflow audit --settle 0:\n%s", out)
	if err != nil {
		t.Fatalf("tapflow audit --settle 0: %v", err)
	}
}

// TestAgentStopShapes runs `tapflow run` (source ebpf, the shipped
// capture defaults: pin_dir /sys/fs/bpf/tapflow) in each deployment shape
// the agent meets, with real TCP (4 MiB one way, 3 MiB back) and UDP
// across two taps, and stops it with SIGINT: Σ bytes in Parquet equal
// the kernel meters exactly per tap and direction after every stop, and
// `tapflow audit --settle 0` passes.
//
//   - netns-exec: `ip netns exec` (a private mount namespace with a fresh
//     /sys: the agent mounts its own bpffs, which dies with it). The pin
//     is reported non-durable (log, tapflow_capture_pin_durable 0,
//     /readyz note); UDP is still flowing when SIGINT lands, 2 s after
//     the TCP transfers.
//   - unshare-no-host-bpffs: unshare -m with a fresh sysfs (a container
//     without the host's bpffs): the same, reached another way.
//   - unshare-host-bpffs: unshare -m with the host's bpffs bind-mounted on
//     /sys/fs/bpf (the documented container deployment): the stop
//     exports, traffic with no agent is counted, the restart adopts it,
//     the final stop exports.
//   - host: the agent in the host's mount namespace; pin_dir on a bpffs
//     instance mounted there (not the machine's /sys/fs/bpf, which other
//     processes and tests share): restart and final stop as above.
//
// Durable shapes stop with no traffic in flight: while the programs stay
// attached, packets during the stop's export are in its meter delta and
// in the next run's records (docs/operations.md).
func TestAgentStopShapes(t *testing.T) {
	for _, tool := range []string{"ip", "unshare", "sh"} {
		prereq.Command(t, tool, "make deps installs iproute2 and util-linux")
	}
	host := ""
	shapes := []shape{
		{name: "netns-exec", durable: false},
		{name: "unshare-no-host-bpffs", durable: false, wrap: func(argv []string) []string {
			return append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
				`umount -l /sys && mount -t sysfs sysfs /sys && exec "$@"`, "sh"}, argv...)
		}},
		{name: "unshare-host-bpffs", durable: true, restart: true},
		{name: "host", durable: true, restart: true},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			lab := nslab.New(t)
			a, b := lab.AddVM(1, true), lab.AddVM(2, true)
			dir := t.TempDir()
			switch sh.name {
			case "netns-exec":
				// A name for the test's own network namespace (where the
				// taps are): ip netns exec then only adds its mount
				// namespace and fresh /sys, as for a hypervisor netns.
				ns := "tfstop" + lab.ID
				if out, err := exec.Command("ip", "netns", "attach", ns, fmt.Sprint(os.Getpid())).CombinedOutput(); err != nil {
					t.Fatalf("ip netns attach: %v: %s", err, out)
				}
				t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
				sh.wrap = func(argv []string) []string { return append([]string{"ip", "netns", "exec", ns}, argv...) }
			case "unshare-host-bpffs":
				host = hostBPFFS(t)
				sh.wrap = func(argv []string) []string {
					return append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
						`mount --bind "$0" /sys/fs/bpf && exec "$@"`, host}, argv...)
				}
			case "host":
				host = hostBPFFS(t)
				sh.pinDir = filepath.Join(host, "tapflow")
				sh.wrap = func(argv []string) []string { return argv }
			}
			cfg := filepath.Join(dir, "tapflow.yaml")
			pin := ""
			if sh.pinDir != "" {
				pin = fmt.Sprintf("  pin_dir: %s\n", sh.pinDir)
			}
			// The shipped defaults but for: this lab's taps only (tap*
			// would take other tests' taps), its inventory, a free
			// metrics port, and the test's directory.
			writeFile(t, cfg, fmt.Sprintf(`node: node-a
data_dir: %s
source: ebpf
capture:
  interfaces: [%q]
%sinventory:
  provider: file
  file: %s
collector:
  output: %s
metrics:
  listen: %s
log:
  format: json
`, dir, lab.Glob(), pin, writeLabInventory(t, dir, a, b), dir, freePort(t)))
			logPath := filepath.Join(dir, "tapflow.log")
			p := startAgent(t, sh, cfg, logPath, a.Tap, b.Tap)
			checkPinReport(t, p, sh.durable)

			runLabTraffic(t, a, b)
			var stopTrickle func()
			if !sh.durable {
				stopTrickle = trickle(t, a, b, 7300)
			}
			time.Sleep(2 * time.Second) // the flows sit in the kernel table (active_timeout 10s)
			p.stop(t)
			if stopTrickle != nil {
				stopTrickle()
			}
			conserved(t, dir, "after stop", a.Tap, b.Tap)
			if !sh.restart {
				auditExact(t, dir)
				return
			}
			// No agent: the programs stay attached and count.
			gap := trickle(t, a, b, 7301)
			time.Sleep(time.Second)
			gap()
			p = startAgent(t, sh, cfg, logPath, a.Tap, b.Tap)
			adopted := false
			for _, e := range logEntries(t, logPath, 0) {
				if e["msg"] == "adopted pinned capture state" {
					adopted = true
				}
			}
			if !adopted {
				t.Errorf("the restart did not adopt the pinned state")
			}
			runLabTraffic(t, a, b)
			time.Sleep(2 * time.Second)
			p.stop(t)
			conserved(t, dir, "after restart and final stop", a.Tap, b.Tap)
			auditExact(t, dir)
		})
	}
}

// checkPinReport: the start reports whether the pin outlives the agent
// (metric, /readyz note, log warning) and counts nothing stranded.
func checkPinReport(t *testing.T, p *agentProc, durable bool) {
	t.Helper()
	var m, ready string
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, m = httpGet(t, p.metrics+"/metrics")
		_, ready = httpGet(t, p.metrics+"/readyz")
		if strings.HasPrefix(ready, "ready") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := map[bool]string{true: "1", false: "0"}[durable]
	if v := metricValue(t, m, "tapflow_capture_pin_durable"); v != want {
		t.Errorf("tapflow_capture_pin_durable %s, want %s", v, want)
	}
	for _, n := range []string{"tapflow_capture_stranded_records_total", "tapflow_capture_stranded_bytes_total"} {
		if v := metricValue(t, m, n); v != "0" {
			t.Errorf("%s %s at start, want 0", n, v)
		}
	}
	note := strings.Contains(ready, "note: capture: capture.pin_dir /sys/fs/bpf/tapflow will not outlive the agent")
	warned := false
	for _, e := range logEntries(t, p.log, 0) {
		if e["level"] == "WARN" && strings.Contains(fmt.Sprint(e["msg"]), "will not outlive the agent") {
			warned = true
		}
	}
	t.Logf("/readyz:\n%s", ready)
	if !strings.HasPrefix(ready, "ready") || note == durable || warned == durable {
		t.Errorf("/readyz %q (note %v), log warning %v; want ready, with the note and the warning exactly when the pin is not durable", ready, note, warned)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
