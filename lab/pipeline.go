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
	// Hypervisor is the namespace to capture in (default: the first
	// hypervisor's); each hypervisor's agent has its own node name.
	Hypervisor string
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
	ns      string             // the namespace it captures in
}

// PipelineConfig is the tapflow config the lab runs with: source ebpf on
// tap* in the hypervisor namespace, the lab's inventory file, short
// capture timeouts (active 2s, idle 2s) and 1 s meters.
func (l *Lab) PipelineConfig(dataDir, extra string) string {
	return l.pipelineConfig(dataDir, extra, l.Cloud.HVNS())
}

func (l *Lab) pipelineConfig(dataDir, extra, hv string) string {
	node := l.Cloud.Prefix
	if hv != l.Cloud.HVNS() {
		node = hv // another compute node: an agent_id of its own
	}
	inv := fmt.Sprintf("  provider: file\n  file: %s\n  poll_interval: 200ms\n", l.InventoryPath())
	if l.reg != nil {
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
inventory:
%sattribution:
  ghost_grace: 60s
  late_binding:
    max_records: 100000
    window: 60s
metrics:
  listen: 127.0.0.1:9464   # inside the hypervisor namespace
log:
  format: json
  level: info
%s`, l.Cloud.Prefix, node, dataDir, inv, extra)
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
	p := &Pipeline{dataDir: abs, logPath: filepath.Join(abs, "tapflow.log"), cfgPath: filepath.Join(abs, "tapflow.yaml"), done: make(chan struct{}),
		ns: hv}
	if err := os.WriteFile(p.cfgPath, []byte(l.pipelineConfig(abs, o.ExtraConfig, hv)), 0o644); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	logf, err := os.Create(p.logPath)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer logf.Close()
	if l.reg != nil {
		if p.fwd, err = forwardLoopback(hv, l.reg.Endpoints, l.log); err != nil {
			return nil, err
		}
	}
	argv := o.Command.argv("run", "--config", p.cfgPath)
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", hv}, argv...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), o.Command.Env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		p.fwd.Close()
		return nil, fmt.Errorf("lab: start tapflow run: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.fwd.Close()
		close(p.done)
	}()
	want := map[string]bool{}
	for _, t := range l.Cloud.Taps() {
		if t.HostNS(l.Cloud) == hv {
			want[t.HostDev] = true
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := map[string]bool{}
		for _, e := range readLog(p.logPath) {
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
			l.log.Info("tapflow run attached", "taps", len(want), "log", p.logPath)
			l.mu.Lock()
			l.pipes = append(l.pipes, p)
			l.mu.Unlock()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("lab: tapflow run exited before attaching (%v); log %s:\n%s", p.err, p.logPath, logTail(p.logPath, 15))
		case <-ctx.Done():
			p.Stop(context.WithoutCancel(ctx))
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("lab: tapflow run attached %d of %d taps within 60s; log %s", len(want)-missing, len(want), p.logPath)
		}
	}
}

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

// DataDir is where the pipeline writes (flows/ under it).
func (p *Pipeline) DataDir() string { return p.dataDir }

// LogPath is tapflow's JSON log.
func (p *Pipeline) LogPath() string { return p.logPath }

// logEntry is the part of tapflow's JSON log lines the lab reads.
type logEntry struct {
	Level         string `json:"level"`
	Msg           string `json:"msg"`
	Ifname        string `json:"ifname"`
	Direction     string `json:"direction"`
	Packets       int64  `json:"packets"`
	Bytes         int64  `json:"bytes"`
	LostPackets   int64  `json:"lost_packets"`
	LostBytes     int64  `json:"lost_bytes"`
	FailedUpdates int64  `json:"failed_updates"`
	Err           string `json:"err"`
}

func readLog(path string) []logEntry {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []logEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e logEntry
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
	for _, e := range readLog(p.logPath) {
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
