package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is a child process that can be killed with SIGKILL and started
// again with the same command line; its stdout and stderr are appended to
// one log file across restarts.
type Process struct {
	bin  string
	args []string
	env  []string
	log  *os.File

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
	kills  int
	// waitErr is what the last run's Wait returned (nil: exit status 0);
	// its own lock, since signal holds mu while waiting for the exit.
	errMu   sync.Mutex
	waitErr error
	cpu     time.Duration // user + system time of every finished run
}

// NewProcess prepares (does not start) bin with args, logging to logPath.
func NewProcess(bin string, args, env []string, logPath string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: log %s: %w", logPath, err)
	}
	return &Process{bin: bin, args: args, env: env, log: f}, nil
}

// Start runs the process; it is an error if it is running. extraEnv is
// added for this start only.
func (p *Process) Start(extraEnv ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("chaos: process already running")
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(append(os.Environ(), p.env...), extraEnv...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(p.log, "=== chaos: start #%d %s\n", p.starts+1, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start %s: %w", p.bin, err)
	}
	p.starts++
	p.cmd = cmd
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		err := cmd.Wait()
		p.errMu.Lock()
		p.waitErr = err
		if st := cmd.ProcessState; st != nil {
			p.cpu += st.UserTime() + st.SystemTime()
		}
		p.errMu.Unlock()
		close(exited)
	}()
	return nil
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() { p.signal(syscall.SIGKILL, time.Minute) }

// Stop sends SIGTERM and waits up to timeout for a graceful exit, then
// SIGKILLs. It reports whether the exit was graceful.
func (p *Process) Stop(timeout time.Duration) bool { return p.signal(syscall.SIGTERM, timeout) }

func (p *Process) signal(sig syscall.Signal, timeout time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return true
	}
	if sig == syscall.SIGKILL {
		p.kills++
		fmt.Fprintf(p.log, "=== chaos: SIGKILL %s\n", time.Now().Format(time.RFC3339Nano))
	}
	_ = p.cmd.Process.Signal(sig)
	graceful := true
	select {
	case <-p.exited:
	case <-time.After(timeout):
		graceful = false
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
	return graceful
}

// Running reports whether the process is alive.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// ExitErr is how the last run ended: nil for exit status 0, else the
// exec error (e.g. "exit status 1", "signal: killed"). Valid once the
// process is no longer running.
func (p *Process) ExitErr() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.waitErr
}

// Pid is the running process's id, 0 when it is not running.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// CPUTime is the user + system CPU time of every run that has ended
// (rusage of the reaped child, killed runs included); a running process's
// time is in /proc/<Pid>/stat.
func (p *Process) CPUTime() time.Duration {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.cpu
}

// Counts returns how often the process was started and SIGKILLed.
func (p *Process) Counts() (starts, kills int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts, p.kills
}

// LogPath is the log file.
func (p *Process) LogPath() string { return p.log.Name() }

// Close stops the process (SIGKILL) and closes the log.
func (p *Process) Close() error {
	p.Kill()
	return p.log.Close()
}

// BuildTapflow builds the tapflow command (no cgo, no race detector) into
// dir and returns the binary's path. repoRoot holds the main go.mod.
func BuildTapflow(repoRoot, dir string) (string, error) {
	if err := Build(repoRoot, dir, "./cmd/tapflow"); err != nil {
		return "", err
	}
	return filepath.Join(dir, "tapflow"), nil
}

// FailpointsTag is the build tag that compiles in the test-only fault
// injection points (sinks/parquet.FailpointEnv); release builds lack it.
const FailpointsTag = "tapflow_failpoints"

// Build builds the main packages pkgs (paths relative to repoRoot, which
// holds the main go.mod) into dir in one go build (no cgo, no race
// detector, with FailpointsTag: crash tests arm the failpoints); each
// binary is named after its package directory.
func Build(repoRoot, dir string, pkgs ...string) error {
	args := append([]string{"build", "-tags", FailpointsTag, "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("chaos: go build %v in %s: %w\n%s", pkgs, repoRoot, err, buf.String())
	}
	return nil
}

// WaitLog waits until a line containing substr is appended to the log
// after the call (polling every 2 ms), or timeout passes. It reports
// whether the line appeared. Used to SIGKILL right after an event.
func (p *Process) WaitLog(substr string, timeout time.Duration) bool {
	name := p.log.Name()
	st, err := os.Stat(name)
	if err != nil {
		return false
	}
	off := st.Size()
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	var carry []byte
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		n, _ := f.ReadAt(buf, off)
		if n > 0 {
			off += int64(n)
			carry = append(carry, buf[:n]...)
			if bytes.Contains(carry, []byte(substr)) {
				return true
			}
			if i := bytes.LastIndexByte(carry, '\n'); i >= 0 {
				carry = carry[i+1:]
			}
			continue
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}
