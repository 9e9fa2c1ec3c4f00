package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSServerPkg is the nats-server main package; BuildNATSServer builds it
// from the version go.mod pins.
const NATSServerPkg = "github.com/nats-io/nats-server/v2"

// BuildNATSServer builds the real nats-server binary (no cgo, no race
// detector) into dir and returns its path.
func BuildNATSServer(repoRoot, dir string) (string, error) {
	if err := Build(repoRoot, dir, NATSServerPkg); err != nil {
		return "", err
	}
	return filepath.Join(dir, "nats-server"), nil
}

// Cluster is a JetStream cluster of real nats-server processes on
// 127.0.0.1, each with its own store directory and fixed ports, so a node
// can be SIGKILLed and started again with the same identity and data.
type Cluster struct {
	Nodes []*ClusterNode
}

// ClusterNode is one server of a Cluster.
type ClusterNode struct {
	*Process
	Name                            string
	ClientPort, RoutePort, HTTPPort int
	store                           string
}

// ClientURL is the node's client URL.
func (n *ClusterNode) ClientURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.ClientPort) }

// ClusterOption changes what NewCluster writes.
type ClusterOption func(*clusterOptions)

type clusterOptions struct{ extra string }

// ExtraConfig appends text to every node's configuration file (e.g. an
// authorization block; no_auth_user keeps Connect working without
// credentials).
func ExtraConfig(text string) ClusterOption {
	return func(o *clusterOptions) { o.extra += text + "\n" }
}

// NewCluster prepares (does not start) size servers of bin under dir:
// dir/<name>/store for JetStream, dir/<name>.conf, dir/<name>.log. Size 1
// is a standalone server (no cluster block: JetStream not clustered).
func NewCluster(bin, dir string, size int, opts ...ClusterOption) (*Cluster, error) {
	var o clusterOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("chaos cluster: %w", err)
	}
	ports, err := freePorts(3 * size)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for i := range size {
		c.Nodes = append(c.Nodes, &ClusterNode{
			Name: fmt.Sprintf("n%d", i+1), ClientPort: ports[3*i], RoutePort: ports[3*i+1], HTTPPort: ports[3*i+2],
			store: filepath.Join(dir, fmt.Sprintf("n%d", i+1), "store"),
		})
	}
	for _, n := range c.Nodes {
		var routes []string
		for _, o := range c.Nodes {
			if o != n {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.RoutePort))
			}
		}
		// nats-server's defaults otherwise, as an operator's cluster has
		// (max_payload 1 MiB: the publisher splits larger batches).
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
}
`, n.Name, n.ClientPort, n.HTTPPort, n.store)
		if size > 1 {
			conf += fmt.Sprintf(`cluster {
  name: tapflow-chaos
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, n.RoutePort, strings.Join(routes, ", "))
		}
		conf += o.extra
		path := filepath.Join(dir, n.Name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, fmt.Errorf("chaos cluster: %w", err)
		}
		if n.Process, err = NewProcess(bin, []string{"-c", path}, nil, filepath.Join(dir, n.Name+".log")); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// freePorts reserves n distinct free loopback ports (closed again before
// use: a small race a parallel test could lose, reported at start).
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("chaos cluster: free port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// URLs is every client URL, comma-separated (a nats.url value).
func (c *Cluster) URLs() string {
	var v []string
	for _, n := range c.Nodes {
		v = append(v, n.ClientURL())
	}
	return strings.Join(v, ",")
}

// Start starts every node and waits until each reports healthy.
func (c *Cluster) Start(timeout time.Duration) error {
	for _, n := range c.Nodes {
		if err := n.Start(); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitHealthy(timeout); err != nil {
			return err
		}
	}
	return nil
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *ClusterNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Close SIGKILLs every node and closes the logs.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		if n.Process != nil {
			errs = append(errs, n.Process.Close())
		}
	}
	return errors.Join(errs...)
}

// Healthy asks the node's /healthz: 200 once it is in the cluster with
// JetStream current (its stream and consumer replicas caught up).
func (n *ClusterNode) Healthy() error {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.HTTPPort))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return nil
}

// WaitHealthy polls Healthy until it succeeds or timeout passes.
func (n *ClusterNode) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := n.Healthy()
		if err == nil {
			return nil
		}
		if !n.Running() {
			return fmt.Errorf("chaos cluster: %s exited; log %s", n.Name, n.LogPath())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos cluster: %s not healthy after %s: %v; log %s", n.Name, timeout, err, n.LogPath())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Connect opens a probe connection to any running node (no reconnects).
func (c *Cluster) Connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(c.URLs(), nats.Name("chaos-probe"), nats.MaxReconnects(0), nats.Timeout(2*time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// StreamInfo asks the cluster for a stream's info (config and the
// leader and replicas of its Raft group).
func (c *Cluster) StreamInfo(stream string) (*jetstream.StreamInfo, error) {
	nc, js, err := c.Connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// ConsumerInfo asks the cluster for a durable consumer's info.
func (c *Cluster) ConsumerInfo(stream, durable string) (*jetstream.ConsumerInfo, error) {
	nc, js, err := c.Connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// WaitLeader polls until stream has a leader other than not (may be "")
// and returns it.
func (c *Cluster) WaitLeader(stream, not string, timeout time.Duration) (*ClusterNode, error) {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		info, err := c.StreamInfo(stream)
		switch {
		case err != nil:
			last = err.Error()
		case info.Cluster == nil || info.Cluster.Leader == "":
			last = "no leader"
		case info.Cluster.Leader == not:
			last = "leader still " + not
		default:
			if n := c.Node(info.Cluster.Leader); n != nil {
				return n, nil
			}
			last = "unknown leader " + info.Cluster.Leader
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("chaos cluster: stream %s: no leader after %s: %s", stream, timeout, last)
}
