package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PipelineOptions tune the `tapflow run` the lab starts in its hypervisor
// namespace. Zero values take the lab defaults (short timeouts, so records
// leave the kernel within seconds).
type PipelineOptions struct {
	// Command runs tapflow: Path + Args, then "run --config FILE".
	Command Command
	// DataDir receives the config, the log (tapflow.log), the embedded
	// NATS store and the Parquet files (flows/dt=…/hour=…/).
	DataDir string
	// ExtraConfig is appended to the generated config (YAML).
	ExtraConfig string
	// Inventory replaces the generated inventory section's body (YAML,
	// indented two spaces), e.g. "  provider: nats\n". Then the
	// pipeline gets neither the OpenStack APIs forwarded into its
	// namespace nor the OS_* variables of this process: it must attribute
	// without any OpenStack access.
	Inventory string
	// Forward lists more host-loopback host:port to make reachable in the
	// hypervisor namespace (an external NATS, say).
	Forward []string
	// Hypervisor is the namespace to capture in (default: the first
	// hypervisor's); each hypervisor's agent has its own node name.
	Hypervisor string
	// PinDir is capture.pin_dir (a directory on a bpffs the caller
	// mounted, which outlives each tapflow process). Empty: the shipped
	// default, /sys/fs/bpf/tapflow — under ip netns exec a bpffs tapflow
	// mounts itself and which goes with it, so every stop detaches and
	// exports the kernel's flows.
	PinDir string
}

// Pipeline is a running `tapflow run` capturing the lab's taps.
type Pipeline struct {
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	dataDir string
	logPath string
	cfgPath string
	fwd     *loopbackForwarder // registered labs: the APIs, reachable in the hypervisor namespace

	// For restarts (Restart): how to start tapflow again.
	ns      string // the namespace it captures in
	command Command
	taps    map[string]bool
	noOSEnv bool // drop this process's OS_* variables (Inventory set)
	runs    int  // processes started
}

// PipelineConfig is the tapflow config the lab runs with: source ebpf on
// tap* in the hypervisor namespace, the lab's inventory file, short
// capture timeouts (active 2s, idle 2s) and 1 s meters.
func (l *Lab) PipelineConfig(dataDir, extra string) string {
	return l.pipelineConfig(dataDir, extra, "", "", l.Cloud.HVNS())
}

func (l *Lab) pipelineConfig(dataDir, extra, inv, pinDir, hv string) string {
	node := l.Cloud.Prefix
	if hv != l.Cloud.HVNS() {
		node = hv // another compute node: an agent_id of its own
	}
	switch {
	case inv != "":
	case l.reg == nil:
		inv = fmt.Sprintf("  provider: file\n  file: %s\n  poll_interval: 200ms\n", l.InventoryPath())
	default:
		// A registered lab: the objects come from the real APIs.
		inv = fmt.Sprintf("  provider: openstack\n  poll_interval: 200ms\n  refresh: 10s\n  openstack:\n    cloud: lab\n    clouds_file: %s\n    interface: %s\n",
			l.CloudsPath(), l.reg.Interface)
	}
	return fmt.Sprintf(`# tapflow config written by tapflow lab %s
node: lab-%s
data_dir: %s
source: ebpf
capture:
  interfaces: ["tap*"]
  active_timeout: 2s
  idle_timeout: 2s
  sweep_interval: 1s
  meter_interval: 1s
  rescan_interval: 1s
%sinventory:
%sattribution:
  ghost_grace: 60s
  swap_barrier: %s
  late_binding:
    max_records: 100000
    window: 60s
metrics:
  listen: 127.0.0.1:9464   # inside the hypervisor namespace
log:
  format: json
  level: info
%s`, l.Cloud.Prefix, node, dataDir, pinDirLine(pinDir), inv, swapBarrier(), extra)
}

// pinDirLine is the capture.pin_dir line: none (the shipped default)
// unless the scenario pins on a bpffs of its own.
func pinDirLine(dir string) string {
	if dir == "" {
		return ""
	}
	return fmt.Sprintf("  pin_dir: %q\n", dir)
}

// swapBarrier is attribution.swap_barrier for the lab's tapflow: 30s, or
// $TAPFLOW_LAB_SWAP_BARRIER (0s runs a scenario without the barrier, to
// see what it changes; docs/lab.md).
func swapBarrier() string {
	if v := os.Getenv("TAPFLOW_LAB_SWAP_BARRIER"); v != "" {
		return strconv.Quote(v)
	}
	return "30s"
}

// StartPipeline starts `tapflow run` inside the hypervisor namespace (the
// capture attaches to the taps there) and returns once every tap of the
// lab is attached.
func (l *Lab) StartPipeline(ctx context.Context, o PipelineOptions) (*Pipeline, error) {
	if o.Command.Path == "" {
		return nil, errors.New("lab: no tapflow command to run the pipeline with")
	}
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("lab: pipeline data dir: %w", err)
	}
	abs, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, err
	}
	hv := o.Hypervisor
	if hv == "" {
		hv = l.Cloud.HVNS()
	}
	p := &Pipeline{dataDir: abs, logPath: filepath.Join(abs, "tapflow.log"), cfgPath: filepath.Join(abs, "tapflow.yaml"),
		ns: hv, command: o.Command, taps: map[string]bool{}, noOSEnv: o.Inventory != ""}
	if err := os.WriteFile(p.cfgPath, []byte(l.pipelineConfig(abs, o.ExtraConfig, o.Inventory, o.PinDir, hv)), 0o644); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	if err := os.WriteFile(p.logPath, nil, 0o644); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	fwd := o.Forward
	if l.reg != nil && o.Inventory == "" {
		fwd = append(slices.Clone(l.reg.Endpoints), fwd...)
	}
	if len(fwd) > 0 {
		var err error
		if p.fwd, err = forwardLoopback(hv, fwd, l.log); err != nil {
			return nil, err
		}
	}
	for _, t := range l.Cloud.Taps() {
		if t.HostNS(l.Cloud) == hv {
			p.taps[t.HostDev] = true
		}
	}
	if err := p.start(ctx); err != nil {
		p.fwd.Close()
		return nil, err
	}
	l.log.Info("tapflow run attached", "taps", len(p.taps), "log", p.logPath)
	l.mu.Lock()
	l.pipes = append(l.pipes, p)
	l.mu.Unlock()
	return p, nil
}

// start starts tapflow (appending to the log) and returns once this
// process logged every tap of the lab attached.
func (p *Pipeline) start(ctx context.Context, extra ...string) error {
	logf, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer logf.Close()
	skip := len(ReadLog(p.logPath)) // entries of earlier processes
	argv := p.command.argv(append([]string{"run", "--config", p.cfgPath}, extra...)...)
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", p.ns}, argv...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	env := os.Environ()
	if p.noOSEnv {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "OS_") })
	}
	p.cmd.Env = append(env, p.command.Env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.done, p.err = make(chan struct{}), nil
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("lab: start tapflow run: %w", err)
	}
	p.runs++
	cmd, done := p.cmd, p.done
	go func() {
		err := cmd.Wait()
		p.err = err
		close(done)
	}()
	want := p.taps
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := map[string]bool{}
		es := ReadLog(p.logPath)
		if len(es) < skip {
			skip = len(es)
		}
		for _, e := range es[skip:] {
			if e.Msg == "attached" {
				got[e.Ifname] = true
			}
		}
		missing := 0
		for t := range want {
			if !got[t] {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("lab: tapflow run exited before attaching (%v); log %s:\n%s", p.err, p.logPath, logTail(p.logPath, 15))
		case <-ctx.Done():
			p.Stop(context.WithoutCancel(ctx))
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop(context.WithoutCancel(ctx))
			return fmt.Errorf("lab: tapflow run attached %d of %d taps within 60s; log %s", len(want)-missing, len(want), p.logPath)
		}
	}
}

// Restart stops tapflow — SIGKILL (kill: no chance to flush, publish or
// commit anything) or SIGTERM — and starts it again with the same config;
// the new process adopts what the old one left pinned (PipelineOptions
// PinDir). detach starts it with --detach (its stop exports everything
// and removes the pinned state). It returns once the new process attached
// every tap.
func (p *Pipeline) Restart(ctx context.Context, kill, detach bool) error {
	if kill {
		select {
		case <-p.done:
		default:
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	} else if err := p.Stop(ctx); err != nil {
		return err
	}
	var extra []string
	if detach {
		extra = append(extra, "--detach")
	}
	return p.start(ctx, extra...)
}

// Runs is how many tapflow processes the pipeline started.
func (p *Pipeline) Runs() int { return p.runs }

// Stop stops the pipeline gracefully (SIGTERM: flush the kernel table,
// publish, drain the stream, commit the Parquet files) and waits.
func (p *Pipeline) Stop(ctx context.Context) error {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(90 * time.Second):
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			return fmt.Errorf("lab: tapflow run did not stop within 90s of SIGTERM; killed (log %s)", p.logPath)
		case <-ctx.Done():
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			return ctx.Err()
		}
	}
	if p.err != nil {
		return fmt.Errorf("lab: tapflow run failed: %v; log %s:\n%s", p.err, p.logPath, logTail(p.logPath, 15))
	}
	return nil
}

// Close releases what the pipeline holds beyond its process (the API
// forwarder of a registered lab). Stop first.
func (p *Pipeline) Close() { p.fwd.Close() }

// DataDir is where the pipeline writes (flows/ under it).
func (p *Pipeline) DataDir() string { return p.dataDir }

// LogPath is tapflow's JSON log.
func (p *Pipeline) LogPath() string { return p.logPath }

// LogEntry is the part of tapflow's JSON log lines the lab reads.
type LogEntry struct {
	Time          time.Time `json:"time"`
	Level         string    `json:"level"`
	Msg           string    `json:"msg"`
	Ifname        string    `json:"ifname"`
	Direction     string    `json:"direction"`
	Packets       int64     `json:"packets"`
	Bytes         int64     `json:"bytes"`
	LostPackets   int64     `json:"lost_packets"`
	LostBytes     int64     `json:"lost_bytes"`
	FailedUpdates int64     `json:"failed_updates"`
	Err           string    `json:"err"`
}

// ReadLog parses tapflow's JSON log at path, skipping lines that are not
// JSON (a missing file reads as no entries: the process has not logged yet).
func ReadLog(path string) []LogEntry {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []LogEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e LogEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	return tail(b, n)
}

// Problems lists the WARN and ERROR lines of the log.
func (p *Pipeline) Problems() []string {
	var out []string
	for _, e := range ReadLog(p.logPath) {
		if e.Level == "WARN" || e.Level == "ERROR" {
			s := e.Level + " " + e.Msg
			if e.Err != "" {
				s += ": " + e.Err
			}
			out = append(out, strings.TrimSpace(s))
		}
	}
	return out
}

// Pid is the pipeline's process id (`ip netns exec` execs tapflow in
// place, so it is tapflow's).
func (p *Pipeline) Pid() int { return p.cmd.Process.Pid }

// ConfigPath is the config file the pipeline runs with.
func (p *Pipeline) ConfigPath() string { return p.cfgPath }
