package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// DebianNATSServer is where Debian 12's nats-server package (2.9.10, the
// oldest server tapflow supports) installs the binary; deploy/scripts/deps.sh
// installs it for make test.
const DebianNATSServer = "/usr/sbin/nats-server"

// DebianNATS returns the path of Debian's nats-server and its version
// ("2.9.10"). When it is missing the test fails as root or with $CI set
// (make test on a prepared machine must run it: deps.sh installs it), and
// skips otherwise.
func DebianNATS(t testing.TB) (bin, version string) {
	t.Helper()
	out, err := exec.Command(DebianNATSServer, "--version").CombinedOutput()
	if err != nil {
		prereq.Require(t, "Debian's nats-server "+DebianNATSServer, err, "apt-get install nats-server (make deps does)")
	}
	// "nats-server: v2.9.10"
	v := strings.TrimSpace(string(out))
	if i := strings.LastIndex(v, " "); i >= 0 {
		v = v[i+1:]
	}
	return DebianNATSServer, strings.TrimPrefix(v, "v")
}

// NewStockNATS prepares (does not start) a stock nats-server binary bin
// as an operator runs it: JetStream storing in store, nats-server's
// defaults otherwise (max_payload 1 MiB), on a free loopback port kept
// for later starts, and no streams (tapflow creates them). Its output is
// appended to logPath.
func NewStockNATS(bin, store, logPath string) (*NATS, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	n, err := NewNATS(bin, store, fmt.Sprintf("127.0.0.1:%d", ports[0]), logPath)
	if err != nil {
		return nil, err
	}
	n.stock = true
	return n, nil
}

// startStock runs the stock server and polls until JetStream answers.
func (n *NATS) startStock() error {
	host, port, _ := strings.Cut(n.addr, ":")
	cmd := exec.Command(n.bin, "-js", "-sd", n.store, "-a", host, "-p", port)
	cmd.Stdout, cmd.Stderr = n.log, n.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(n.log, "=== chaos: nats start %s\n", time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start %s: %w", n.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(time.Minute)
	var last error
	for {
		if last = jetStreamUp("nats://" + n.addr); last == nil {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("chaos: nats exited at start; log %s", n.log.Name())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("chaos: nats not ready after 1m: %v; log %s", last, n.log.Name())
		}
	}
	n.cmd, n.exited = cmd, exited
	return nil
}

// jetStreamUp: the server at url accepts a connection and JetStream
// answers (it has recovered its store).
func jetStreamUp(url string) error {
	nc, err := nats.Connect(url, nats.Name("chaos-probe"), nats.MaxReconnects(0), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}
