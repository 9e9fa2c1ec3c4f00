package chaos

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// NATS is a nats-server run as a child process, JetStream storing in a
// directory: either the chaosnats command (cmd/chaosnats, built with
// Build: the linked version, the tapflow streams created; NewNATS) or a
// stock nats-server binary such as Debian's (no streams; NewStockNATS).
// It can be stopped and started again on the same address and store.
type NATS struct {
	bin, store, addr string
	stock            bool // NewStockNATS: a plain nats-server, no streams
	log              *os.File
	cmd              *exec.Cmd
	exited           chan struct{}
}

// NewNATS prepares (does not start) a server from the chaosnats binary
// bin, storing in store and listening on addr ("127.0.0.1:0": a free port,
// kept for later starts). Its stderr is appended to logPath.
func NewNATS(bin, store, addr, logPath string) (*NATS, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: nats log %s: %w", logPath, err)
	}
	return &NATS{bin: bin, store: store, addr: addr, log: f}, nil
}

// Addr is the server's host:port (known after the first Start).
func (n *NATS) Addr() string { return n.addr }

// LogPath is the server's log file.
func (n *NATS) LogPath() string { return n.log.Name() }

// Start runs the server and waits (up to a minute) until it accepts
// connections (chaosnats: with the streams in place; a stock server: with
// JetStream answering).
func (n *NATS) Start() error {
	if n.cmd != nil {
		return errors.New("chaos: nats already running")
	}
	if n.stock {
		return n.startStock()
	}
	cmd := exec.Command(n.bin, "-store", n.store, "-listen", n.addr)
	cmd.Stderr = n.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	fmt.Fprintf(n.log, "=== chaos: nats start %s\n", time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start %s: %w", n.bin, err)
	}
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
		_, _ = io.Copy(io.Discard, out)
	}()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var line string
	select {
	case line = <-ready:
	case <-exited:
		return fmt.Errorf("chaos: nats exited at start; log %s", n.log.Name())
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("chaos: nats not ready after 1m; log %s", n.log.Name())
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "ready nats://")
	if !ok {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("chaos: nats did not start (said %q); log %s", line, n.log.Name())
	}
	n.addr, n.cmd, n.exited = url, cmd, exited
	return nil
}

// Stop sends SIGTERM and waits for the graceful shutdown (JetStream
// flushed), SIGKILLing after 30 s. It is a no-op when not running.
func (n *NATS) Stop() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		fmt.Fprintf(n.log, "=== chaos: nats did not stop in 30s; SIGKILL\n")
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
	n.cmd = nil
}

// Close stops the server and closes the log.
func (n *NATS) Close() error {
	n.Stop()
	return n.log.Close()
}
