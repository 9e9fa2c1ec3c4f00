package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/transport"
)

// fleet is the PKI and role users of a secured bus (docs/security.md).
type fleet struct {
	dir     string
	pki     transporttest.PKI
	secrets map[string]string
	users   []transport.ServerUser
	logs    *syncBuffer
}

func newFleet(t *testing.T, users ...transport.ServerUser) *fleet {
	t.Helper()
	f := &fleet{dir: t.TempDir(), secrets: map[string]string{}, logs: &syncBuffer{}}
	f.pki = transporttest.NewPKI(t, f.dir)
	for _, u := range users {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		f.secrets[u.User] = "pw-" + hex.EncodeToString(b)
		u.PasswordFile = f.secret(t, "server-"+u.User, f.secrets[u.User])
		f.users = append(f.users, u)
	}
	return f
}

func (f *fleet) secret(t *testing.T, name, value string) string {
	t.Helper()
	p := filepath.Join(f.dir, name+".pw")
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fleet) log(name string) *slog.Logger {
	return slog.New(slog.NewTextHandler(f.logs, nil)).With("process", name)
}

// config is a process on node, small synthetic load, no metrics port.
func (f *fleet) config(t *testing.T, node string, edit func(*config.Config)) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Node, cfg.DataDir = node, filepath.Join(f.dir, node)
	cfg.Synthetic.Tenants, cfg.Synthetic.VMsPerTenant, cfg.Synthetic.LoadBalancers = 2, 3, 1
	cfg.Synthetic.FlowsPerSecond, cfg.Synthetic.RecordsPerSecond = 100, 2000
	cfg.Synthetic.BatchRecords = 500
	cfg.Synthetic.BatchMaxAge = units.Duration(200 * time.Millisecond)
	// roll_age 1s (shipped 5m; ack_wait follows it): the tests wait for
	// rows in Parquet while the collector runs.
	cfg.Collector.Parquet.RollAge = units.Duration(time.Second)
	cfg.Collector.Consumer.AckWait = units.Duration(12 * time.Second)
	cfg.Metrics.Listen = ""
	edit(&cfg)
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// client points cfg at url as user, with mutual TLS.
func (f *fleet) client(t *testing.T, c *config.Config, url, user string) {
	c.NATS.URL = url
	c.NATS.TLS = transport.TLSConfig{CAFile: f.pki.CA, CertFile: f.pki.ClientCert, KeyFile: f.pki.ClientKey}
	c.NATS.User, c.NATS.PasswordFile = user, f.secret(t, "client-"+user, f.secrets[user])
}

func (f *fleet) server(c *config.Config, listen string) {
	c.NATS.Listen = listen
	c.NATS.Server = transport.ServerConfig{
		TLS:   transport.ServerTLS{CertFile: f.pki.ServerCert, KeyFile: f.pki.ServerKey, CAFile: f.pki.CA},
		Users: f.users,
	}
}

// checkLogs: nothing was refused for permissions, and no password of any
// user is in any process's log.
func (f *fleet) checkLogs(t *testing.T) {
	t.Helper()
	logs := f.logs.String()
	for _, bad := range []string{"permission violation", "refused the credentials", "Permissions Violation"} {
		if strings.Contains(logs, bad) {
			t.Errorf("log has %q: a role lacks a permission its process needs:\n%s", bad, grepLines(logs, bad))
		}
	}
	for user, s := range f.secrets {
		if strings.Contains(logs, s) {
			t.Errorf("password of %s in the log", user)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func loopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitRows polls the Parquet output until every node in want has rows,
// and checks that each record's agent_id is its node (agent.id default).
func waitRows(t *testing.T, output string, nodes ...string) {
	t.Helper()
	var per map[string]int
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		per = map[string]int{}
		for _, r := range readParquet(t, output) {
			per[r.Node]++
			if r.AgentID != r.Node {
				t.Fatalf("record of node %s has agent_id %s", r.Node, r.AgentID)
			}
		}
		ok := true
		for _, n := range nodes {
			ok = ok && per[n] > 0
		}
		if ok {
			t.Logf("rows per node: %v", per)
			return
		}
	}
	t.Fatalf("rows per node %v, want rows of %v", per, nodes)
}

// TestSecureFleet runs the real processes of docs/security.md's layout
// against a nats-server with mutual TLS and role users: a collector and
// two agents, each with only its role's permissions, deliver every
// node's records to Parquet without one refused publish or subscribe.
func TestSecureFleet(t *testing.T) {
	f := newFleet(t,
		transport.ServerUser{User: "agent-n1", Role: transport.RoleAgent, Node: "n1"},
		transport.ServerUser{User: "agent-n2", Role: transport.RoleAgent, Node: "n2"},
		transport.ServerUser{User: "collector", Role: transport.RoleCollector})
	// The NATS server of the fleet (a real nats-server, in this process).
	hub := f.config(t, "nats", func(c *config.Config) { f.server(c, "127.0.0.1:0") })
	srv, err := transport.NewEmbeddedServer(transport.StoreDir(hub.DataDir), "fleet", hub.NATS, f.log("nats-server"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	url := srv.ClientURL()

	col := f.config(t, "col", func(c *config.Config) {
		f.client(t, c, url, "collector") // agent_id_is_node: the default
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	colCtx, stopCol := context.WithCancel(ctx)
	colDone := make(chan error, 1)
	go func() { colDone <- RunCollector(colCtx, col, f.log("collector")) }()

	no := false
	agentDone := make(chan error, 2)
	agentCtx, stopAgents := context.WithTimeout(ctx, 5*time.Second)
	defer stopAgents()
	for _, n := range []string{"n1", "n2"} {
		a := f.config(t, n, func(c *config.Config) {
			f.client(t, c, url, "agent-"+n)
			c.NATS.ManageStreams = &no
		})
		go func() { agentDone <- RunAgent(agentCtx, a, f.log("agent-"+n)) }()
	}
	for range 2 {
		if err := <-agentDone; err != nil {
			t.Fatalf("agent: %v", err)
		}
	}
	waitRows(t, col.Collector.Parquet.Output, "n1", "n2")
	stopCol()
	if err := <-colDone; err != nil {
		t.Fatalf("collector: %v", err)
	}
	f.checkLogs(t)
}

// TestSecureRunHub: `tapflow run` on a hub serves its embedded server on a
// non-loopback-capable listener with TLS and users (its own agent and
// collector connect in-process), and a remote agent with an agent user
// delivers through it.
func TestSecureRunHub(t *testing.T) {
	f := newFleet(t,
		transport.ServerUser{User: "agent-n2", Role: transport.RoleAgent, Node: "n2"},
		transport.ServerUser{User: "ops", Role: transport.RoleAdmin})
	addr := loopbackAddr(t)
	hub := f.config(t, "hub", func(c *config.Config) { f.server(c, addr) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hubCtx, stopHub := context.WithCancel(ctx)
	hubDone := make(chan error, 1)
	go func() { hubDone <- RunAll(hubCtx, hub, f.log("hub")) }()

	no := false
	remote := f.config(t, "n2", func(c *config.Config) {
		f.client(t, c, "tls://"+addr, "agent-n2")
		c.NATS.ManageStreams = &no
	})
	agentCtx, stopAgent := context.WithTimeout(ctx, 5*time.Second)
	defer stopAgent()
	if err := RunAgent(agentCtx, remote, f.log("agent-n2")); err != nil {
		t.Fatalf("remote agent: %v", err)
	}
	waitRows(t, hub.Collector.Parquet.Output, "hub", "n2")
	stopHub()
	if err := <-hubDone; err != nil {
		t.Fatalf("hub: %v", err)
	}
	f.checkLogs(t)
}
