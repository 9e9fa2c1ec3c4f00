//go:build linux

package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

const (
	pkgName   = "tapflow"
	svcUser   = "tapflow"
	tenant    = "5d1b6f1e9c4a4f0e8f0f7a1b2c3d4e5f"
	udpPort   = 7311
	udpSize   = 1000
	installed = "/usr/bin/tapflow"
)

// TestPackageInstall builds the Debian package (make package: nfpm),
// installs it with dpkg, checks what it put where, verifies the installed
// units, then runs the installed agent as user tapflow with only CAP_BPF,
// CAP_NET_ADMIN and CAP_PERFMON (setpriv, as the agent unit does) on a
// namespace lab with real traffic, and reads its attributed flow records
// back from a test JetStream. Without one of those capabilities the agent
// must refuse to start and name it. Cleanup purges the package, removes
// the user and the lab.
func TestPackageInstall(t *testing.T) {
	prereq.Root(t, "dpkg -i, a system user, eBPF")
	for _, tool := range []string{"dpkg", "dpkg-query", "setpriv", "adduser", "make", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing: make deps (deploy/scripts/deps.sh) installs it", tool)
		}
	}
	needAnalyze(t)
	if out, _ := exec.Command("dpkg-query", "-W", "-f=${Status}", pkgName).Output(); strings.Contains(string(out), "installed") {
		t.Fatalf("package %s is already installed on this host (%s); this test installs and purges its own: dpkg --purge %s", pkgName, out, pkgName)
	}
	if _, err := user.Lookup(svcUser); err == nil {
		t.Fatalf("user %s already exists; this test needs the package to create it: deluser --system %s", svcUser, svcUser)
	}

	deb := buildPackage(t)
	t.Cleanup(func() { purge(t) })
	start := time.Now()
	out, err := dpkg("-i", deb)
	t.Logf("dpkg -i %s (%s):\n%s", filepath.Base(deb), time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("dpkg -i: %v", err)
	}
	u, err := user.Lookup(svcUser)
	if err != nil {
		t.Fatalf("the package did not create user %s: %v", svcUser, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)

	t.Run("Files", func(t *testing.T) { checkFiles(t, uid, gid) })
	t.Run("VerifyInstalledUnits", func(t *testing.T) {
		var paths []string
		for _, u := range units {
			paths = append(paths, "/usr/lib/systemd/system/"+u.file)
		}
		verifyUnits(t, paths)
	})
	t.Run("ValidateShippedConfig", func(t *testing.T) {
		// The services read the config as tapflow; the example is valid.
		out, err := asTapflow(context.Background(), nil, installed, "validate", "/etc/tapflow/tapflow.yaml").CombinedOutput()
		if err != nil {
			t.Errorf("tapflow validate /etc/tapflow/tapflow.yaml as %s: %v\n%s", svcUser, err, out)
		}
	})

	t.Run("ReinstallKeepsConfig", func(t *testing.T) { reinstallKeepsConfig(t, deb, gid) })
	t.Run("PinDirLayout", func(t *testing.T) { pinDirLayout(t) })

	lab := nslab.New(t)
	a, b := lab.AddVM(1, true), lab.AddVM(2, true)
	dir := agentDir(t, uid, gid)
	s := transporttest.Run(t, "")
	node := "pkg-" + lab.ID
	cfgPath := writeConfig(t, dir, uid, gid, node, lab.Glob(), s.ClientURL(), a, b)

	t.Run("AgentCapturesAsTapflow", func(t *testing.T) {
		agentCaptures(t, s.JS, cfgPath, node, a, b)
	})
	t.Run("LeastPrivilege", func(t *testing.T) {
		for _, tc := range []struct{ drop, want string }{
			{"bpf", "CAP_BPF"},
			{"net_admin", "CAP_NET_ADMIN"},
			{"perfmon", "CAP_PERFMON"}, // the verifier forbids the programs' pointer arithmetic
		} {
			t.Run("without_"+tc.drop, func(t *testing.T) {
				var caps []string
				for _, c := range []string{"bpf", "net_admin", "perfmon"} {
					if c != tc.drop {
						caps = append(caps, c)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				cmd := asTapflow(ctx, caps, installed, "agent", "--config", cfgPath)
				out, err := cmd.CombinedOutput()
				if ctx.Err() != nil {
					t.Fatalf("agent without %s still running after 60s; want it to refuse to start:\n%s", tc.want, out)
				}
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 {
					t.Errorf("agent without %s: %v, want exit 1\n%s", tc.want, err, out)
				}
				if !strings.Contains(string(out), "missing "+tc.want) {
					t.Errorf("agent without %s: the error does not name the missing capability (want %q):\n%s", tc.want, "missing "+tc.want, out)
				}
				for _, line := range strings.Split(string(out), "\n") {
					if strings.Contains(line, "missing CAP_") {
						t.Logf("without %s: %s", tc.want, line)
					}
				}
			})
		}
	})
}

// dpkg runs dpkg, waiting (up to 5 min) while another dpkg or apt holds
// its lock: other phases of make test may install Debian packages now.
func dpkg(args ...string) ([]byte, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		out, err := exec.Command("dpkg", args...).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("lock")) || time.Now().After(deadline) {
			return out, err
		}
		time.Sleep(2 * time.Second)
	}
}

// buildPackage runs `make package` into a directory of this test.
func buildPackage(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	start := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "package", "DIST="+dist)
	// Under make test the parent make's jobserver descriptors are not
	// inherited; its MAKEFLAGS would only make this make warn.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make package: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "tapflow_*_amd64.deb"))
	if len(debs) != 1 {
		t.Fatalf("make package made %q, want one dist/tapflow_<version>_amd64.deb", debs)
	}
	t.Logf("make package: %s in %s", filepath.Base(debs[0]), time.Since(start).Round(time.Second))
	return debs[0]
}

// purge removes the package, its user and group, whatever state the test
// left them in.
func purge(t *testing.T) {
	if out, err := dpkg("--purge", pkgName); err != nil {
		t.Errorf("dpkg --purge %s: %v\n%s", pkgName, err, out)
	}
	if _, err := user.Lookup(svcUser); err == nil {
		if out, err := exec.Command("userdel", svcUser).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", svcUser, err, out)
		}
	}
	if _, err := user.LookupGroup(svcUser); err == nil {
		if out, err := exec.Command("groupdel", svcUser).CombinedOutput(); err != nil {
			t.Errorf("groupdel %s: %v\n%s", svcUser, err, out)
		}
	}
	for _, p := range []string{installed, "/etc/tapflow", "/var/lib/tapflow"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s still there after dpkg --purge", p)
		}
	}
}

func checkFiles(t *testing.T, uid, gid int) {
	for _, f := range []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{installed, 0o755, 0, 0},
		{"/etc/tapflow", os.ModeDir | 0o750, 0, gid},
		{"/etc/tapflow/tapflow.yaml", 0o640, 0, gid},
		{"/var/lib/tapflow", os.ModeDir | 0o750, uid, gid},
		{"/usr/lib/systemd/system/tapflow-agent.service", 0o644, 0, 0},
		{"/usr/lib/systemd/system/tapflow-collector.service", 0o644, 0, 0},
		{"/usr/lib/systemd/system/tapflow.service", 0o644, 0, 0},
		{"/usr/lib/systemd/system/tapflow-inventory.service", 0o644, 0, 0},
		{"/usr/lib/systemd/system/tapflow-billing.service", 0o644, 0, 0},
		{"/usr/share/doc/tapflow/operations.md", 0o644, 0, 0},
		{"/usr/share/doc/tapflow/billing.md", 0o644, 0, 0},
	} {
		st, err := os.Stat(f.path)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode() != f.mode || int(sys.Uid) != f.uid || int(sys.Gid) != f.gid {
			t.Errorf("%s: %v %d:%d, want %v %d:%d", f.path, st.Mode(), sys.Uid, sys.Gid, f.mode, f.uid, f.gid)
		}
	}
	out, err := exec.Command("dpkg-query", "-W", "-f=${Conffiles}", pkgName).Output()
	if err != nil || !strings.Contains(string(out), "/etc/tapflow/tapflow.yaml") {
		t.Errorf("/etc/tapflow/tapflow.yaml is not a conffile (an upgrade would overwrite the operator's edits): %v %q", err, out)
	}
	// A system user without a login: uid below 1000, no shell.
	pw, err := exec.Command("getent", "passwd", svcUser).Output()
	fields := strings.Split(strings.TrimSpace(string(pw)), ":")
	if err != nil || len(fields) != 7 {
		t.Fatalf("getent passwd %s: %v %q", svcUser, err, pw)
	}
	if uid >= 1000 || fields[5] != "/var/lib/tapflow" || !strings.HasSuffix(fields[6], "nologin") {
		t.Errorf("user %s: %q, want a system uid (<1000), home /var/lib/tapflow, shell nologin", svcUser, pw)
	}
	if out, err := exec.Command(installed, "version").Output(); err != nil || !strings.HasPrefix(string(out), "tapflow ") {
		t.Errorf("%s version: %v %q", installed, err, out)
	}
}

// asTapflow runs argv as user tapflow with only the given capabilities
// (setpriv; names without CAP_, e.g. "bpf") in the inheritable, ambient
// and bounding sets, and no_new_privs: what the agent unit's User=,
// AmbientCapabilities=, CapabilityBoundingSet= and NoNewPrivileges= give.
func asTapflow(ctx context.Context, caps []string, argv ...string) *exec.Cmd {
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	args := []string{"--reuid=" + svcUser, "--regid=" + svcUser, "--init-groups",
		"--inh-caps=" + set, "--ambient-caps=" + set, "--bounding-set=" + set, "--no-new-privs", "--"}
	cmd := exec.CommandContext(ctx, "setpriv", append(args, argv...)...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// agentDir is a directory the tapflow user owns, below a test directory
// it may traverse (t.TempDir's parent is 0700 root).
func agentDir(t *testing.T, uid, gid int) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	d := filepath.Join(dir, "agent")
	if err := os.Mkdir(d, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, uid, gid); err != nil {
		t.Fatal(err)
	}
	return d
}

func writeConfig(t *testing.T, dir string, uid, gid int, node, glob, natsURL string, vms ...*nslab.VM) string {
	t.Helper()
	// The agent pins its kernel state (capture.pin_dir). As the unit's
	// ExecStartPre does, root prepares a directory on a bpffs owned by
	// tapflow, here on a private bpffs instance so the host's /sys/fs/bpf
	// (not even mounted on a CI container) is never touched.
	mnt := filepath.Join(dir, "bpffs")
	if err := os.Mkdir(mnt, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0711"); err != nil {
		t.Fatalf("mount a private bpffs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	pin := filepath.Join(mnt, "tapflow")
	if err := os.Mkdir(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(pin, uid, gid); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`node: %s
data_dir: %s
source: ebpf
capture:
  pin_dir: %s
  interfaces: [%q]
  memory_budget: 8MiB
  max_interfaces: 8
  active_timeout: 1s
  idle_timeout: 2s
  sweep_interval: 1s
inventory:
  provider: file
  file: %s
nats:
  url: %s
agent:
  shutdown_timeout: 20s
metrics:
  listen: ""
log:
  format: text
`, node, filepath.Join(dir, "data"), pin, glob, filepath.Join(dir, "inventory.yaml"), natsURL)
	for name, body := range map[string]string{"inventory.yaml": nslab.Inventory(tenant, vms...), "tapflow.yaml": cfg} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "tapflow.yaml")
}

// syncBuf is an io.Writer safe for the process's output and the test.
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

// agentCaptures runs the installed agent with the three capabilities,
// checks its credentials in /proc, sends UDP from VM a to VM b and waits
// for the attributed flow records of that traffic on JetStream.
func agentCaptures(t *testing.T, js jetstream.JetStream, cfgPath, node string, a, b *nslab.VM) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Interest retention: the consumer exists before the first publish.
	cons, err := js.OrderedConsumer(ctx, transport.FlowsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{transport.FlowsSubject(node)},
	})
	if err != nil {
		t.Fatal(err)
	}

	var logs syncBuf
	cmd := asTapflow(context.Background(), []string{"bpf", "net_admin", "perfmon"}, installed, "agent", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("agent exit after SIGTERM: %v\n%s", err, logs.String())
			}
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("agent did not stop within 60s of SIGTERM\n%s", logs.String())
		}
	}
	defer stop()

	// Both taps attached (the log says so per tap) before traffic.
	for deadline := time.Now().Add(45 * time.Second); strings.Count(logs.String(), "msg=attached") < 2; {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("agent exited before attaching: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not attach both taps within 45s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkCreds(t, cmd.Process.Pid)

	sent := sendUDP(t, a, b, 200)
	var flows []schemas.Flow
	var got int64
	d := consume.DefaultConfig()
	dec, err := schemas.NewDecoder().Limited(int64(d.MaxMessageBytes), d.MaxBatchRecords)
	if err != nil {
		t.Fatal(err)
	}
	for got < sent && ctx.Err() == nil {
		batch, err := cons.Fetch(16, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			recs, err := dec.Decode(nil, msg.Data())
			if err != nil {
				t.Fatalf("decode %s: %v", msg.Subject(), err)
			}
			for _, f := range recs {
				if f.DstPort == udpPort && f.Ifname == a.Tap && f.Direction == "tx" {
					flows = append(flows, f)
					got += f.Packets
					if f.TenantID != tenant || f.Node != node || f.VMMAC != a.MAC.String() || f.Bytes < f.Packets*udpSize {
						t.Errorf("flow record not attributed to VM a or short: %+v", f)
					}
				}
			}
		}
	}
	t.Logf("agent as %s with CAP_BPF,CAP_NET_ADMIN,CAP_PERFMON: %d UDP packets sent a → b, %d counted in %d flow records on %s", svcUser, sent, got, len(flows), a.Tap)
	if got != sent {
		t.Errorf("flow records count %d packets of the %d sent\n%s", got, sent, logs.String())
	}
	stop()
}

// checkCreds reads the running agent's credentials: uid tapflow and an
// effective capability set of exactly CAP_NET_ADMIN (12), CAP_PERFMON (38)
// and CAP_BPF (39).
func checkCreds(t *testing.T, setprivPid int) {
	t.Helper()
	// setpriv execs the agent: same pid.
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", setprivPid))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := user.Lookup(svcUser)
	want := fmt.Sprintf("%016x", uint64(1)<<12|uint64(1)<<38|uint64(1)<<39)
	for _, line := range strings.Split(string(st), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "Uid":
			if f := strings.Fields(v); len(f) != 4 || f[0] != u.Uid || f[1] != u.Uid {
				t.Errorf("agent Uid: %q, want %s (%s)", v, u.Uid, svcUser)
			}
		case "CapEff", "CapPrm", "CapAmb", "CapBnd":
			if v != want {
				t.Errorf("agent %s: %s, want %s (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON only)", k, v, want)
			}
		case "NoNewPrivs":
			if v != "1" {
				t.Errorf("agent NoNewPrivs: %s, want 1", v)
			}
		}
	}
}

// sendUDP sends n datagrams of udpSize bytes from a to b, paced, and
// returns how many b received.
func sendUDP(t *testing.T, a, b *nslab.VM, n int) int64 {
	t.Helper()
	var rx net.PacketConn
	if err := b.Do(func() (err error) {
		rx, err = net.ListenPacket("udp4", net.JoinHostPort(b.IP.String(), strconv.Itoa(udpPort)))
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var tx net.Conn
	if err := a.Do(func() (err error) {
		tx, err = net.Dial("udp4", net.JoinHostPort(b.IP.String(), strconv.Itoa(udpPort)))
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	var received int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			_ = rx.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, _, err := rx.ReadFrom(buf); err != nil {
				return
			}
			received++
		}
	}()
	payload := make([]byte, udpSize)
	for i := 0; i < n; i++ {
		if _, err := tx.Write(payload); err != nil {
			t.Fatal(err)
		}
		if i%20 == 19 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	<-done
	if received == 0 {
		t.Fatal("VM b received no datagram from VM a")
	}
	return received
}

// reinstallKeepsConfig installs the package over itself (dpkg's upgrade
// path: preinst upgrade, conffile handling, postinst) after an operator
// edit of the config: the edit stays, the modes are as before.
func reinstallKeepsConfig(t *testing.T, deb string, gid int) {
	const cfg = "/etc/tapflow/tapflow.yaml"
	orig, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	edited := append(append([]byte{}, orig...), "# edited by the operator\n"...)
	if err := os.WriteFile(cfg, edited, 0o640); err != nil {
		t.Fatal(err)
	}
	if out, err := dpkg("-i", deb); err != nil {
		t.Fatalf("dpkg -i again: %v\n%s", err, out)
	}
	got, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, edited) {
		t.Errorf("reinstall replaced the edited %s", cfg)
	}
	st, err := os.Stat(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); st.Mode() != 0o640 || sys.Uid != 0 || int(sys.Gid) != gid {
		t.Errorf("%s after reinstall: %v %d:%d, want 0640 root:tapflow", cfg, st.Mode(), sys.Uid, sys.Gid)
	}
	if err := os.WriteFile(cfg, orig, 0o640); err != nil {
		t.Fatal(err)
	}
}

// pinDirLayout checks the agent unit's bpffs arrangement for the pinned
// maps and links (capture.pin_dir /sys/fs/bpf/tapflow) in a private mount
// namespace: bpffs as systemd mounts it (0700 root), the unit's own
// ExecStartPre= command, then its sandbox (TemporaryFileSystem=
// /sys/fs/bpf:ro, BindPaths=/sys/fs/bpf/tapflow) built by hand, as
// systemd is not PID 1 here. As tapflow with the agent's three
// capabilities: pinning into the pin directory of the host layout fails
// (0700 root parent), in the sandbox it works, and nothing else of bpffs
// is writable.
func pinDirLayout(t *testing.T) {
	for _, tool := range []string{"unshare", "bpftool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing: make deps (deploy/scripts/deps.sh) installs it", tool)
		}
	}
	pre := readUnit(t, "/usr/lib/systemd/system/tapflow-agent.service")["ExecStartPre"]
	if len(pre) != 1 || !strings.HasPrefix(pre[0], "+/bin/sh -c '") || !strings.HasSuffix(pre[0], "'") {
		t.Fatalf("agent ExecStartPre = %q, want one +/bin/sh -c '...' run as root", pre)
	}
	prepare := strings.TrimSuffix(strings.TrimPrefix(pre[0], "+/bin/sh -c '"), "'")
	as := "setpriv --reuid=tapflow --regid=tapflow --init-groups --inh-caps=-all,+bpf,+net_admin,+perfmon " +
		"--ambient-caps=-all,+bpf,+net_admin,+perfmon --bounding-set=-all,+bpf,+net_admin,+perfmon --no-new-privs --"
	pin := func(path string) string {
		return as + " bpftool map create " + path + " type array key 4 value 4 entries 1 name tfprobe"
	}
	script := `set -e
mount -t bpf -o mode=0700 bpf /sys/fs/bpf
` + prepare + `
stat -c '%a %U:%G' /sys/fs/bpf/tapflow
if ` + pin("/sys/fs/bpf/tapflow/host") + ` 2>/dev/null; then echo "host layout: pinned"; else echo "host layout: refused"; fi
stage=$(mktemp -d)
mount --bind /sys/fs/bpf/tapflow "$stage"
mount -t tmpfs -o mode=0755 tmpfs /sys/fs/bpf
mkdir /sys/fs/bpf/tapflow
mount -o remount,ro /sys/fs/bpf
mount --bind "$stage" /sys/fs/bpf/tapflow
` + pin("/sys/fs/bpf/tapflow/sandbox") + `
echo "sandbox: pinned"
` + as + ` bpftool map show pinned /sys/fs/bpf/tapflow/sandbox >/dev/null
if ` + pin("/sys/fs/bpf/elsewhere") + ` 2>/dev/null; then echo "outside: pinned"; else echo "outside: refused"; fi
`
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
	t.Logf("pin directory layout:\n%s", out)
	if err != nil {
		t.Fatalf("pin directory layout: %v", err)
	}
	for _, want := range []string{"700 tapflow:tapflow", "host layout: refused", "sandbox: pinned", "outside: refused"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("pin directory layout: want %q in the output", want)
		}
	}
}
