//go:build linux

package container

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

const (
	tenant = "5d1b6f1e9c4a4f0e8f0f7a1b2c3d4e5f"
	// imageUID is the image's user tapflow (deploy/container/build.sh).
	imageUID = 65532
	// capMask is CAP_NET_ADMIN (12), CAP_PERFMON (38) and CAP_BPF (39).
	capMask = uint64(1)<<12 | uint64(1)<<38 | uint64(1)<<39
)

// agentCaps are the podman flags of docs/containers.md for the agent:
// root in the container (Docker and Kubernetes give a non-root user no
// ambient capabilities), exactly the three capabilities, no privilege
// gain, the host's network.
var agentCaps = []string{"--user", "0:0", "--cap-drop", "ALL", "--cap-add", "BPF", "--cap-add", "NET_ADMIN", "--cap-add", "PERFMON",
	"--security-opt", "no-new-privileges", "--network", "host", "--read-only"}

// collectorFlags: the image's user, no capability at all.
var collectorFlags = []string{"--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--network", "host", "--read-only"}

// TestImage builds the image with `make image`, then, for each way of
// running the agent in a container (the host's bpffs bind-mounted at
// /sys/fs/bpf, or none), runs the collector and the agent from it under
// podman on a namespace lab with real TCP traffic: run, stop, traffic
// while no agent runs, run again, stop. After each stop the Parquet
// written by the collector holds, for every tap and direction, exactly
// the bytes and packets of the kernel's meters (flows = meters, nothing
// lost). With the bpffs the second run adopts the pinned state, so the
// traffic of the restart gap is in both; without it the programs leave
// with the agent and neither counts the gap. Without one of its
// capabilities, or under podman's unchanged seccomp profile, the agent
// from the image refuses to start and names the cause.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the image and runs containers (~100 s)")
	}
	needTools(t)
	image := buildImage(t)
	for _, tc := range []struct {
		name  string
		bpffs bool // bind-mount a bpffs (a private instance standing for the host's) at /sys/fs/bpf
	}{
		{"HostBPFFS", true},
		{"NoBPFFS", false},
	} {
		t.Run(tc.name, func(t *testing.T) { runCase(t, image, tc.bpffs) })
	}
	t.Run("LeastPrivilege", func(t *testing.T) { leastPrivilege(t, image) })
}

// needTools: as root (CI) a missing tool fails the test, naming what
// installs it; otherwise the test skips.
func needTools(t *testing.T) {
	t.Helper()
	prereq.Root(t, "podman (rootful), network namespaces, eBPF")
	for _, tool := range []string{"podman", "runc", "ip", "make"} {
		prereq.Command(t, tool, "make deps (deploy/scripts/deps.sh) installs it")
	}
}

// buildImage runs `make image` with a tag of this test and removes the
// image at the end.
func buildImage(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("localhost/tapflow-test:%d", time.Now().UnixNano())
	start := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "image", "IMAGE="+tag, "DIST="+t.TempDir())
	// Under make test the parent make's jobserver descriptors are not
	// inherited; its MAKEFLAGS would only make this make warn.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = podman(context.Background(), "rmi", "--force", tag).Run() })
	size, err := podman(context.Background(), "image", "inspect", "--format", "{{.Size}}", tag).Output()
	if err != nil {
		t.Fatalf("podman image inspect %s: %v", tag, err)
	}
	t.Logf("make image: %s, %s bytes, in %s", tag, strings.TrimSpace(string(size)), time.Since(start).Round(time.Second))
	return tag
}

// podman runs podman with runc, the runtime of Docker and containerd
// (Kolla-Ansible, OpenStack-Helm); crun 1.8, podman's default on Debian
// 12, refuses hosts with cgroup v1 and a controller left on the v2
// hierarchy ("cgroups in hybrid mode not supported"), as CI machines are.
func podman(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "podman", append([]string{"--runtime", "runc"}, args...)...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// ulimits are the test process's own limits: podman raises RLIMIT_NOFILE
// and RLIMIT_NPROC in the container by default, which a host without
// CAP_SYS_RESOURCE (a CI sandbox) refuses ("setrlimit: operation not
// permitted").
func ulimits(t *testing.T) []string {
	t.Helper()
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	return []string{"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Max, nofile.Max), "--ulimit", "nproc=4096:4096"}
}

// ctr is one container run in the foreground by `podman run --rm`.
type ctr struct {
	t      *testing.T
	name   string
	logs   *syncBuf
	exited chan error
	done   bool
}

func start(t *testing.T, name string, flags []string, image string, args ...string) *ctr {
	t.Helper()
	c := &ctr{t: t, name: name, logs: &syncBuf{}, exited: make(chan error, 1)}
	argv := append([]string{"run", "--rm", "--name", name, "--stop-timeout", "60"}, ulimits(t)...)
	argv = append(append(append(argv, flags...), image), args...)
	cmd := podman(context.Background(), argv...)
	cmd.Stdout, cmd.Stderr = c.logs, c.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if !c.done {
			_ = podman(context.Background(), "rm", "--force", "--time", "0", name).Run()
			<-c.exited
		}
	})
	return c
}

// stop sends SIGTERM (podman stop) and waits for a clean exit.
func (c *ctr) stop() {
	c.t.Helper()
	if out, err := podman(context.Background(), "stop", "--time", "60", c.name).CombinedOutput(); err != nil {
		c.t.Errorf("podman stop %s: %v\n%s", c.name, err, out)
	}
	select {
	case err := <-c.exited:
		c.done = true
		if err != nil {
			c.t.Fatalf("%s exited after SIGTERM: %v\n%s", c.name, err, c.logs)
		}
	case <-time.After(90 * time.Second):
		c.t.Fatalf("%s did not exit within 90s of SIGTERM\n%s", c.name, c.logs)
	}
}

// wait returns the exit error of a container that stops by itself.
func (c *ctr) wait(d time.Duration) error {
	c.t.Helper()
	select {
	case err := <-c.exited:
		c.done = true
		return err
	case <-time.After(d):
		c.t.Fatalf("%s still running after %s\n%s", c.name, d, c.logs)
		return nil
	}
}

// waitLog waits until the logs hold n lines containing s.
func (c *ctr) waitLog(s string, n int, d time.Duration) {
	c.t.Helper()
	for deadline := time.Now().Add(d); strings.Count(c.logs.String(), s) < n; {
		select {
		case err := <-c.exited:
			c.done = true
			c.t.Fatalf("%s exited (%v) before logging %q %d times:\n%s", c.name, err, s, n, c.logs)
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s did not log %q %d times within %s:\n%s", c.name, s, n, d, c.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// creds checks the container's process: uid and every capability set.
func (c *ctr) creds(uid int, caps uint64) {
	c.t.Helper()
	out, err := podman(context.Background(), "inspect", "--format", "{{.State.Pid}}", c.name).Output()
	if err != nil {
		c.t.Fatalf("podman inspect %s: %v", c.name, err)
	}
	st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(out)) + "/status")
	if err != nil {
		c.t.Fatal(err)
	}
	want := fmt.Sprintf("%016x", caps)
	seen := 0
	for _, line := range strings.Split(string(st), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "Uid":
			seen++
			if f := strings.Fields(v); len(f) != 4 || f[0] != strconv.Itoa(uid) || f[1] != strconv.Itoa(uid) {
				c.t.Errorf("%s Uid: %q, want %d", c.name, v, uid)
			}
		case "CapEff", "CapPrm", "CapBnd":
			seen++
			if v != want {
				c.t.Errorf("%s %s: %s, want %s", c.name, k, v, want)
			}
		case "NoNewPrivs":
			seen++
			if v != "1" {
				c.t.Errorf("%s NoNewPrivs: %s, want 1", c.name, v)
			}
		}
	}
	if seen != 5 {
		c.t.Errorf("%s: /proc status lacks Uid, Cap* or NoNewPrivs:\n%s", c.name, st)
	}
}

// seccompProfile writes podman's default seccomp profile with bpf(2)
// allowed to a holder of CAP_BPF, as docs/containers.md has operators do
// (its jq command makes the same file): containers-common 0.50 (Debian
// 12) allows bpf(2) only with CAP_SYS_ADMIN, so the agent's first bpf(2)
// fails with EPERM ("permission denied although CAP_BPF, CAP_PERFMON and
// CAP_NET_ADMIN are held ... a seccomp filter"). Docker's default profile
// has that rule. Without CAP_BPF (and CAP_SYS_ADMIN) bpf(2) still fails
// with EPERM, not with the profile's default ENOSYS, so the agent can
// name the missing capability.
func seccompProfile(t *testing.T, dir string) string {
	t.Helper()
	const src = "/usr/share/containers/seccomp.json"
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("podman's default seccomp profile: %v (Debian package golang-github-containers-common, a dependency of podman)", err)
	}
	var prof map[string]any
	if err := json.Unmarshal(b, &prof); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	rules, _ := prof["syscalls"].([]any)
	for _, r := range rules {
		r, _ := r.(map[string]any)
		if r["action"] != "SCMP_ACT_ERRNO" {
			continue
		}
		names, _ := r["names"].([]any)
		kept := []any{}
		for _, n := range names {
			if n != "bpf" {
				kept = append(kept, n)
			}
		}
		r["names"] = kept
	}
	prof["syscalls"] = append(rules,
		map[string]any{"names": []string{"bpf"}, "action": "SCMP_ACT_ALLOW", "includes": map[string]any{"caps": []string{"CAP_BPF"}}},
		map[string]any{"names": []string{"bpf"}, "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "errno": "EPERM",
			"excludes": map[string]any{"caps": []string{"CAP_BPF", "CAP_SYS_ADMIN"}}})
	out, err := json.Marshal(prof)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "seccomp-bpf.json")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// lab is one case's world: VMs, NATS, directories, configs.
type lab struct {
	t                     *testing.T
	image                 string
	a, b                  *nslab.VM
	nats                  *transporttest.Server
	cfgDir, agentData     string
	output, bpffs, suffix string
	seccomp               string // the agent's seccomp profile
	metrics               int    // the agent's metrics port
}

func newLab(t *testing.T, image string, bpffs bool) *lab {
	t.Helper()
	nl := nslab.New(t)
	l := &lab{t: t, image: image, a: nl.AddVM(1, true), b: nl.AddVM(2, true), nats: transporttest.Run(t, ""), suffix: nl.ID}
	base := t.TempDir()
	// The collector (uid 65532) must reach its bind mounts' contents.
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	l.cfgDir, l.agentData, l.output = mkdir(t, base, "etc", 0o755, 0), mkdir(t, base, "agent", 0o700, 0), mkdir(t, base, "out", 0o750, imageUID)
	if bpffs {
		// A private bpffs instance stands for the host's /sys/fs/bpf,
		// which the test must not touch (a CI container may not have it).
		l.bpffs = mkdir(t, base, "bpffs", 0o700, 0)
		if err := syscall.Mount("bpf", l.bpffs, "bpf", 0, "mode=0700"); err != nil {
			t.Fatalf("mount a private bpffs: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(l.bpffs, syscall.MNT_DETACH) })
	}
	l.seccomp = seccompProfile(t, base)
	node := "ctr-" + nl.ID
	write(t, filepath.Join(l.cfgDir, "inventory.yaml"), nslab.Inventory(tenant, l.a, l.b))
	l.metrics = freePort(t)
	write(t, filepath.Join(l.cfgDir, "agent.yaml"), shippedConfig(t, node, nl.Glob(), l.nats.ClientURL(), l.metrics))
	write(t, filepath.Join(l.cfgDir, "collector.yaml"), shippedConfig(t, node, nl.Glob(), l.nats.ClientURL(), freePort(t)))
	return l
}

func mkdir(t *testing.T, parent, name string, mode os.FileMode, uid int) string {
	t.Helper()
	p := filepath.Join(parent, name)
	if err := os.Mkdir(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t *testing.T, p, body string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// shippedConfig is deploy/examples/tapflow.yaml (what the image ships at
// /etc/tapflow/tapflow.yaml) with only what a test must set: the lab's
// node name, taps and inventory, source ebpf (the example ships the
// synthetic source), the test's NATS server (the example embeds one
// only in `tapflow run`) and a metrics port of its own (host network:
// the two containers and other tests would share 9464). Capture
// (pin_dir /sys/fs/bpf/tapflow included), agent, transport and collector
// settings stay at the shipped values.
func shippedConfig(t *testing.T, node, glob, natsURL string, metricsPort int) string {
	t.Helper()
	b, err := os.ReadFile("../examples/tapflow.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	sub := func(k string) map[string]any {
		m, ok := cfg[k].(map[string]any)
		if !ok {
			t.Fatalf("deploy/examples/tapflow.yaml has no %s section", k)
		}
		return m
	}
	cfg["node"] = node
	cfg["source"] = "ebpf"
	sub("capture")["interfaces"] = []string{glob}
	sub("inventory")["file"] = "/etc/tapflow/inventory.yaml"
	sub("nats")["url"] = natsURL
	sub("metrics")["listen"] = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	if got := sub("capture")["pin_dir"]; got != "/sys/fs/bpf/tapflow" {
		t.Fatalf("the example's capture.pin_dir is %v; this test is written for /sys/fs/bpf/tapflow", got)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func (l *lab) collector() *ctr {
	c := start(l.t, "tfc-"+l.suffix, append(append([]string{}, collectorFlags...),
		"-v", l.cfgDir+":/etc/tapflow:ro", "-v", l.output+":/var/lib/tapflow"),
		l.image, "collector", "--config", "/etc/tapflow/collector.yaml")
	c.waitLog(`"msg":"tapflow starting"`, 1, 60*time.Second)
	return c
}

func (l *lab) agent(run int) *ctr {
	flags := append(append([]string{}, agentCaps...), "--security-opt", "seccomp="+l.seccomp,
		"-v", l.cfgDir+":/etc/tapflow:ro", "-v", l.agentData+":/var/lib/tapflow")
	if l.bpffs != "" {
		flags = append(flags, "-v", l.bpffs+":/sys/fs/bpf:rslave")
	}
	c := start(l.t, fmt.Sprintf("tfa-%s-%d", l.suffix, run), flags, l.image, "agent", "--config", "/etc/tapflow/agent.yaml")
	c.waitLog(`"msg":"attached"`, 2, 60*time.Second)
	c.creds(0, capMask)
	l.pinReported(c)
	return c
}

// Whether the pin outlives the agent, as the agent reports it at start
// (docs/containers.md): a gauge, a /readyz note and a log line.
const (
	pinDurableGauge = "tapflow_capture_pin_durable"
	pinReadyNote    = "note: capture: "
	pinWarning      = "will not outlive the agent"
)

// pinReported checks that the agent says whether its pinned state
// outlives it: with the host's bpffs it does, without one it does not.
func (l *lab) pinReported(c *ctr) {
	l.t.Helper()
	durable := l.bpffs != ""
	want := pinDurableGauge + " 0"
	if durable {
		want = pinDurableGauge + " 1"
	}
	if m := l.get("/metrics"); !strings.Contains(m, "\n"+want+"\n") {
		l.t.Errorf("agent /metrics: want %q", want)
	}
	ready := l.get("/readyz")
	if strings.Contains(ready, pinReadyNote) != !durable {
		l.t.Errorf("agent /readyz (bpffs mounted: %v): %q, want a %q line only without the host's bpffs", durable, ready, pinReadyNote)
	}
	if strings.Contains(c.logs.String(), pinWarning) != !durable {
		l.t.Errorf("agent log (bpffs mounted: %v): want %q only without the host's bpffs:\n%s", durable, pinWarning, c.logs)
	}
	l.t.Logf("agent /readyz: %q; log: %s", ready, lineWith(c.logs.String(), "pin_dir"))
}

// lineWith is the first line of s containing sub, or "".
func lineWith(s, sub string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			return line
		}
	}
	return ""
}

// get returns the body of the agent's metrics endpoint at path.
func (l *lab) get(path string) string {
	l.t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", l.metrics, path))
	if err != nil {
		l.t.Fatalf("agent %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		l.t.Fatalf("agent %s: %v", path, err)
	}
	return string(b)
}

// drained waits until the collector has been handed every message of
// both streams (nothing pending for its consumers): stopping it then
// commits them all to Parquet.
func (l *lab) drained() {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, c := range [][2]string{{transport.FlowsStream, transport.DefaultDurable}, {transport.MetersStream, transport.DefaultDurable + transport.MetersDurableSuffix}} {
		for {
			cons, err := l.nats.JS.Consumer(ctx, c[0], c[1])
			if err == nil {
				info, err := cons.Info(ctx)
				if err == nil && info.NumPending == 0 && info.Delivered.Stream > 0 {
					break
				}
			}
			if ctx.Err() != nil {
				l.t.Fatalf("consumer %s/%s: messages still pending after 90s", c[0], c[1])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// empty checks that the collector acked (committed) every message.
func (l *lab) empty() {
	l.t.Helper()
	for _, s := range []string{transport.FlowsStream, transport.MetersStream} {
		st, err := l.nats.JS.Stream(context.Background(), s)
		if err != nil {
			l.t.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			l.t.Fatal(err)
		}
		if info.State.Msgs != 0 {
			l.t.Errorf("stream %s holds %d messages after the collector stopped; want every one committed and acked", s, info.State.Msgs)
		}
	}
}

func runCase(t *testing.T, image string, bpffs bool) {
	l := newLab(t, image, bpffs)
	taps := []tapDir{{l.a.Tap, "tx"}, {l.a.Tap, "rx"}, {l.b.Tap, "tx"}, {l.b.Tap, "rx"}}

	// Run 1, then a stop: the stop exports what the kernel holds.
	col := l.collector()
	col.creds(imageUID, 0)
	ag := l.agent(1)
	p1 := traffic(t, l.a, l.b, 2<<20, 1<<20)
	ag.stop()
	l.drained()
	col.stop()
	l.empty()
	after1 := conserved(t, l.output, "after the first stop", taps, p1)

	// The restart gap: traffic while no agent runs.
	gap := traffic(t, l.a, l.b, 1<<20, 1<<20)

	// Run 2, then the final stop.
	col = l.collector()
	ag = l.agent(2)
	adopted := strings.Contains(ag.logs.String(), `"adopted":true`)
	p2 := traffic(t, l.a, l.b, 1<<20, 2<<20)
	ag.stop()
	l.drained()
	col.stop()
	l.empty()
	final := conserved(t, l.output, "after the restart and the final stop", taps, sum(p1, p2))

	for _, k := range taps {
		inRun2 := final[k] - after1[k]
		if bpffs {
			// The programs stayed attached and the second run adopted
			// their state: the gap's traffic is in meters and flows.
			if inRun2 < gap[k]+p2[k] {
				t.Errorf("%s/%s: %d bytes metered in run 2 and the gap, less than their payload %d: the restart did not adopt the pinned state",
					k.ifname, k.dir, inRun2, gap[k]+p2[k])
			}
		} else if inRun2 >= gap[k]+p2[k] {
			// Nothing outlived the first agent: the gap went unmetered.
			t.Errorf("%s/%s: %d bytes metered in run 2, at least the gap's and run 2's payload %d: something counted the gap without a bpffs",
				k.ifname, k.dir, inRun2, gap[k]+p2[k])
		}
	}
	if adopted != bpffs {
		t.Errorf("second run adopted pinned state: %v, want %v\n%s", adopted, bpffs, ag.logs)
	}
}

func sum(ms ...map[tapDir]int64) map[tapDir]int64 {
	s := map[tapDir]int64{}
	for _, m := range ms {
		for k, v := range m {
			s[k] += v
		}
	}
	return s
}

// tapDir is one tap and direction (the VM's point of view).
type tapDir struct{ ifname, dir string }

// conserved reads the Parquet output and checks, for every tap and
// direction: Σ flow bytes and packets = Σ meter bytes and packets, no
// loss, meter bytes ≥ the payload the applications moved. It returns the
// meter bytes.
func conserved(t *testing.T, output, when string, taps []tapDir, payload map[tapDir]int64) map[tapDir]int64 {
	t.Helper()
	type sums struct{ packets, bytes, lost int64 }
	fs, ms := map[tapDir]*sums{}, map[tapDir]*sums{}
	get := func(m map[tapDir]*sums, k tapDir) *sums {
		if m[k] == nil {
			m[k] = &sums{}
		}
		return m[k]
	}
	for _, f := range readRows[schemas.Flow](t, output, "flows") {
		s := get(fs, tapDir{f.Ifname, f.Direction})
		s.packets += f.Packets
		s.bytes += f.Bytes
	}
	for _, m := range readRows[schemas.Meter](t, output, "meters") {
		s := get(ms, tapDir{m.Ifname, m.Direction})
		s.packets += m.Packets
		s.bytes += m.Bytes
		s.lost += m.LostBytes
	}
	bytes := map[tapDir]int64{}
	for _, k := range taps {
		f, m := get(fs, k), get(ms, k)
		t.Logf("%s: %s/%s: flows %d packets %d bytes, meters %d packets %d bytes (lost %d), payload %d",
			when, k.ifname, k.dir, f.packets, f.bytes, m.packets, m.bytes, m.lost, payload[k])
		if f.bytes != m.bytes || f.packets != m.packets {
			t.Errorf("%s: %s/%s: Parquet flows %d bytes / %d packets != kernel meters %d / %d (difference %d bytes)",
				when, k.ifname, k.dir, f.bytes, f.packets, m.bytes, m.packets, m.bytes-f.bytes)
		}
		if m.lost != 0 {
			t.Errorf("%s: %s/%s: the kernel lost %d bytes", when, k.ifname, k.dir, m.lost)
		}
		if m.bytes < payload[k] {
			t.Errorf("%s: %s/%s: meters count %d bytes, less than the %d bytes of payload", when, k.ifname, k.dir, m.bytes, payload[k])
		}
		bytes[k] = m.bytes
	}
	return bytes
}

// readRows returns every committed row of one schema under dir/sub.
func readRows[T any](t *testing.T, dir, sub string) []T {
	t.Helper()
	var all []T
	err := filepath.WalkDir(filepath.Join(dir, sub), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		rows, err := pq.Read[T](f, st.Size())
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
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

// traffic sends ab bytes over TCP from a to b and ba bytes from b to a at
// once, and returns the payload that crossed each tap and direction, as
// the receiving application counted it.
func traffic(t *testing.T, a, b *nslab.VM, ab, ba int) map[tapDir]int64 {
	t.Helper()
	var wg sync.WaitGroup
	var errAB, errBA error
	wg.Add(2)
	go func() { defer wg.Done(); errAB = tcp(a, b, ab) }()
	go func() { defer wg.Done(); errBA = tcp(b, a, ba) }()
	wg.Wait()
	for _, err := range []error{errAB, errBA} {
		if err != nil {
			t.Fatal(err)
		}
	}
	quiet(t, a.Tap, b.Tap)
	return map[tapDir]int64{
		{a.Tap, "tx"}: int64(ab), {b.Tap, "rx"}: int64(ab),
		{b.Tap, "tx"}: int64(ba), {a.Tap, "rx"}: int64(ba),
	}
}

// quiet waits until no packet has crossed the taps for 300 ms (the
// kernel's own interface counters). With a pin that outlives the agent
// the stop exports while the programs keep counting: a packet in the
// milliseconds between the export and the last meter reading is in this
// stop's meter delta and in the next run's flows (docs/operations.md), so
// a stop is only exact per run with nothing in flight. The connections'
// last ACKs can trail the applications that closed them.
func quiet(t *testing.T, taps ...string) {
	t.Helper()
	read := func() string {
		var b strings.Builder
		for _, tap := range taps {
			for _, c := range []string{"rx_packets", "tx_packets"} {
				v, err := os.ReadFile(filepath.Join("/sys/class/net", tap, "statistics", c))
				if err != nil {
					t.Fatalf("read %s's counters: %v", tap, err)
				}
				b.Write(v)
			}
		}
		return b.String()
	}
	last, since := read(), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Since(since) < 300*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("packets still crossing %v 30 s after the transfers ended", taps)
		}
		time.Sleep(50 * time.Millisecond)
		if cur := read(); cur != last {
			last, since = cur, time.Now()
		}
	}
}

// tcp sends n bytes from one VM to another on a new connection; all of
// them arrive or it fails. It returns once both ends have closed.
func tcp(from, to *nslab.VM, n int) error {
	var ln net.Listener
	if err := to.Do(func() (err error) { ln, err = net.Listen("tcp4", to.IP.String()+":0"); return }); err != nil {
		return err
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- 0
			return
		}
		k, _ := io.Copy(io.Discard, c)
		c.Close()
		got <- k
	}()
	var c net.Conn
	if err := from.Do(func() (err error) { c, err = net.Dial("tcp4", ln.Addr().String()); return }); err != nil {
		return err
	}
	_, werr := c.Write(make([]byte, n))
	c.Close()
	if k := <-got; werr != nil || k != int64(n) {
		return fmt.Errorf("TCP %s → %s delivered %d of %d bytes (write: %v)", from.Name, to.Name, k, n, werr)
	}
	return nil
}

// leastPrivilege: the agent from the image without one of its three
// capabilities refuses to start and names it; with all three under
// podman's default seccomp profile it refuses and names seccomp.
func leastPrivilege(t *testing.T, image string) {
	l := newLab(t, image, true) // the pin directory is no obstacle: the capabilities are
	for _, tc := range []struct{ name, drop, seccomp, want string }{
		{"without_BPF", "BPF", l.seccomp, "missing CAP_BPF"},
		{"without_NET_ADMIN", "NET_ADMIN", l.seccomp, "missing CAP_NET_ADMIN"},
		{"without_PERFMON", "PERFMON", l.seccomp, "missing CAP_PERFMON"},
		{"podman_default_seccomp", "", "/usr/share/containers/seccomp.json", "are held (uid 0): a seccomp filter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var flags []string
			for i := 0; i < len(agentCaps); i++ {
				if agentCaps[i] == "--cap-add" && agentCaps[i+1] == tc.drop {
					i++
					continue
				}
				flags = append(flags, agentCaps[i])
			}
			flags = append(flags, "--security-opt", "seccomp="+tc.seccomp, "-v", l.bpffs+":/sys/fs/bpf:rslave",
				"-v", l.cfgDir+":/etc/tapflow:ro", "-v", l.agentData+":/var/lib/tapflow")
			c := start(t, "tfa-"+l.suffix+"-"+strings.ToLower(tc.name), flags, image, "agent", "--config", "/etc/tapflow/agent.yaml")
			err := c.wait(60 * time.Second)
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Errorf("agent %s: %v, want exit 1\n%s", tc.name, err, c.logs)
			}
			if !strings.Contains(c.logs.String(), tc.want) {
				t.Errorf("agent %s: the error does not say %q:\n%s", tc.name, tc.want, c.logs)
			}
			t.Logf("agent %s: %s", tc.name, lineWith(c.logs.String(), "tapflow agent failed"))
		})
	}
}

// syncBuf is an io.Writer safe for a process's output and the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
