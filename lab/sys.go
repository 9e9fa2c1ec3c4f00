package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Command is how the lab runs its helper (`tapflow lab serve|send`): Path
// with Args before the subcommand, and extra environment. The CLI uses its
// own executable and ["lab"]; tests re-execute the test binary.
type Command struct {
	Path string
	Args []string
	Env  []string
}

func (c Command) argv(sub ...string) []string {
	return append(append([]string{c.Path}, c.Args...), sub...)
}

// Packages are the Debian packages the lab needs (binary → package).
var Packages = []struct{ Bin, Pkg string }{
	{"ip", "iproute2"}, {"nft", "nftables"}, {"haproxy", "haproxy"}, {"keepalived", "keepalived"},
}

// InstallHint is the command that installs every package the lab uses.
const InstallHint = "apt-get install -y iproute2 nftables haproxy keepalived"

// MissingPackages lists the Debian packages whose binaries are not found.
func MissingPackages() []string {
	var out []string
	for _, p := range Packages {
		if _, err := exec.LookPath(p.Bin); err != nil {
			out = append(out, p.Pkg)
		}
	}
	return out
}

// InstallPackages installs missing packages with apt-get (root only).
// It is a no-op when everything is present.
func InstallPackages(ctx context.Context, w io.Writer) error {
	miss := MissingPackages()
	if len(miss) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("lab: missing Debian packages %s; as root: %s", strings.Join(miss, " "), InstallHint)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("lab: missing packages %s and no apt-get; install them with your package manager", strings.Join(miss, " "))
	}
	fmt.Fprintf(w, "lab: installing %s\n", strings.Join(miss, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, miss...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(out, 20))
		}
	}
	return nil
}

func tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// sh runs one command and returns a wrapped error with its output.
func (l *Lab) sh(ctx context.Context, name string, args ...string) error {
	_, err := l.out(ctx, name, args...)
	return err
}

func (l *Lab) out(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	l.ncmd.Add(1)
	l.log.Debug("exec", "cmd", name+" "+strings.Join(args, " "), "took", time.Since(start).Round(time.Microsecond))
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// ip runs `ip -n ns args…` (ns "" = the caller's namespace, used only for
// `ip netns` itself).
func (l *Lab) ip(ctx context.Context, ns string, args ...string) error {
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	return l.sh(ctx, "ip", args...)
}

// nsexec runs a command inside a namespace and waits for it.
func (l *Lab) nsexec(ctx context.Context, ns string, argv ...string) ([]byte, error) {
	return l.out(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
}

func (l *Lab) sysctl(ctx context.Context, ns string, kv ...string) error {
	_, err := l.nsexec(ctx, ns, append([]string{"sysctl", "-q", "-w"}, kv...)...)
	return err
}

// spawn starts a long-running process in a namespace, detached into its
// own session, output in <state>/logs/<name>.log. The lab reaps it; `down`
// ends it (every process in the lab's namespaces is the lab's).
func (l *Lab) spawn(ns, name string, env []string, argv ...string) (int, error) {
	logPath := filepath.Join(l.dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("lab: %w", err)
	}
	defer f.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("lab: start %s in %s: %w", argv[0], ns, err)
	}
	l.log.Debug("spawned", "ns", ns, "name", name, "pid", cmd.Process.Pid, "argv", strings.Join(argv, " "))
	done := make(chan struct{})
	l.mu.Lock()
	if l.procs == nil {
		l.procs = map[string]chan struct{}{}
	}
	l.procs[name] = done
	l.mu.Unlock()
	go func() { // reap, and let waiters see an early exit
		cmd.Wait()
		close(done)
	}()
	return cmd.Process.Pid, nil
}

// NetnsDir is where iproute2 keeps named namespaces.
const NetnsDir = "/run/netns"

// ListNamespaces returns the named namespaces of lab prefix (all labs
// when prefix is empty: names "<letters+digits>-hv" mark a lab).
func ListNamespaces(prefix string) ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lab: list %s: %w", NetnsDir, err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}

// Labs lists the prefixes of the labs present (by their hypervisor
// namespace).
func Labs() ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lab: list %s: %w", NetnsDir, err)
	}
	var out []string
	for _, e := range ents {
		if p, ok := strings.CutSuffix(e.Name(), "-hv"); ok && ValidPrefix(p) == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// nsPids lists the processes whose network namespace is ns.
func nsPids(ns string) []int {
	target, err := os.Stat(filepath.Join(NetnsDir, ns))
	if err != nil {
		return nil
	}
	st, ok := target.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var s syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &s) == nil && s.Ino == st.Ino && s.Dev == st.Dev {
			out = append(out, pid)
		}
	}
	return out
}

func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// state is the field after the ")" of the command name; Z = zombie
	if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

// DefaultStateRoot holds one directory per lab.
const DefaultStateRoot = "/run/tapflow-lab"

// Teardown removes lab prefix: it ends every process in its namespaces
// (SIGTERM, SIGKILL after grace), deletes the namespaces (which deletes
// every device in them, taps and bridges included) and the state
// directory. It needs nothing but the prefix, so it cleans up after a
// crash too. It touches nothing outside "<prefix>-*" namespaces.
func Teardown(ctx context.Context, prefix, stateDir string, log *slog.Logger) ([]string, error) {
	if err := ValidPrefix(prefix); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	names, err := ListNamespaces(prefix)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, ns := range names {
		pids = append(pids, nsPids(ns)...)
	}
	for _, pid := range pids {
		if pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(pid) && pid != os.Getpid() {
			log.Warn("lab down: process ignored SIGTERM; killing", "pid", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	var errs []error
	for _, ns := range names {
		out, err := exec.CommandContext(ctx, "ip", "netns", "del", ns).CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", ns, err, strings.TrimSpace(string(out))))
		}
	}
	if stateDir == "" {
		stateDir = filepath.Join(DefaultStateRoot, prefix)
	}
	// A lab created with --register also deletes its OpenStack objects;
	// when that fails the state directory (their record) is kept.
	if err := unregisterState(ctx, stateDir, log); err != nil {
		errs = append(errs, err)
	} else if _, err := os.Stat(filepath.Join(stateDir, stateMarker)); err == nil {
		// Only a directory the lab made (it holds the marker) is removed.
		if err := os.RemoveAll(stateDir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return names, fmt.Errorf("lab down %s: %w", prefix, err)
	}
	log.Info("lab down", "prefix", prefix, "namespaces", len(names), "processes", len(pids))
	return names, nil
}

// exited reports whether a process this Lab spawned under name has ended.
func (l *Lab) exited(name string) bool {
	l.mu.Lock()
	done := l.procs[name]
	l.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func (l *Lab) logTail(name string) string {
	return logTail(filepath.Join(l.dir, "logs", name+".log"), 10)
}

// mountBPF mounts a bpffs instance of its own at dir (created 0700).
func mountBPF(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := syscall.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("lab: mount bpffs on %s: %w", dir, err)
	}
	return nil
}

// unmountBPF unmounts it; what is still pinned there is released.
func unmountBPF(dir string) { syscall.Unmount(dir, syscall.MNT_DETACH) }
