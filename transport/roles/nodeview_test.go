package roles_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/enrich/nodeview"
	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/roles"
)

// TestNodeViewNamesAgree: the overlay names the permissions use are the
// ones enrich/nodeview publishes under (transport's).
func TestNodeViewNamesAgree(t *testing.T) {
	for _, c := range [][2]string{
		{roles.InventoryNodeRoot + ".n1", transport.InventoryNodeSubject("n1")},
		{"$JS.API.DIRECT.GET." + roles.InventoryNodesStream + "." + roles.InventoryNodeRoot + ".n1", nodeview.DirectGetSubject("n1")},
	} {
		if c[0] != c[1] {
			t.Errorf("roles has %q, nodeview %q", c[0], c[1])
		}
	}
}

// TestNodeViewIsolation (node-scoped views) runs on Debian's
// nats-server configured as docs/security.md shows and on the embedded
// server with the doc's users: the inventory service publishes every
// node's overlay; each agent reads its own, and reading another node's
// (by the pinned direct get, by the bare direct get naming it in the
// body, live on its subject, or through a consumer) is refused as a
// permission violation.
func TestNodeViewIsolation(t *testing.T) {
	servers := []struct {
		name  string
		start func(t *testing.T) *bus
	}{
		{"nats-server", func(t *testing.T) *bus {
			bin, version := chaos.DebianNATS(t)
			t.Logf("nats-server %s", version)
			return startExternal(t, bin, documentedConf(t))
		}},
		{"embedded", startEmbedded},
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) { runNodeView(t, s.start(t)) })
	}
}

// documentedConf is the nats-server configuration docs/security.md shows.
func documentedConf(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- roles:begin nats-server.conf -->\n")
	if ok {
		_, rest, ok = strings.Cut(rest, "```\n")
	}
	if !ok {
		t.Fatal("docs/security.md: no generated nats-server.conf block")
	}
	conf, _, _ := strings.Cut(rest, "```")
	return conf
}

// startEmbedded is the embedded server (nats.listen, nats.server.users)
// holding the doc's users.
func startEmbedded(t *testing.T) *bus {
	dir := t.TempDir()
	b := &bus{pki: transporttest.NewPKI(t, dir), dir: dir, log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	cfg := transport.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Server.TLS = transport.ServerTLS{CertFile: b.pki.ServerCert, KeyFile: b.pki.ServerKey, CAFile: b.pki.CA}
	for _, u := range roles.Example().Users {
		pw := filepath.Join(dir, "server-"+u.Name+".pw")
		if err := os.WriteFile(pw, []byte("pw-"+u.Name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Server.Users = append(cfg.Server.Users, transport.ServerUser{User: u.Name, PasswordFile: pw, Role: string(u.Role), Node: u.Node, Ordered: u.Ordered,
			Durable: map[bool]string{true: u.Durable}[u.Role == roles.Subscriber]})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := transport.NewEmbeddedServer(filepath.Join(dir, "store"), "roles", cfg, b.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	b.url = e.ClientURL()
	return b
}

// nodeInventory is a two-node cloud: two tenants, one VM of each on each
// node.
func nodeInventory() *inventory.Inventory {
	inv := testInventory(4)
	for i := range inv.Ports {
		inv.Ports[i].BindingHostID = []string{"cmp1", "cmp2"}[i%2]
		inv.Ports[i].DeviceID = "server-" + inv.Ports[i].ID
	}
	return inv
}

func runNodeView(t *testing.T, b *bus) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nb, err := nodeview.New([]byte("a test key of 16 bytes or more"))
	if err != nil {
		t.Fatal(err)
	}
	x := nb.NewIndex(nodeInventory())

	// The service publishes both overlays with its role's rights.
	svc := b.connect(t, "inventory", nil)
	if err := nodeview.EnsureStream(ctx, svc.js, 1); err != nil {
		t.Fatalf("inventory cannot create %s: %v", transport.InventoryNodesStream, err)
	}
	for _, node := range x.Nodes() {
		if err := nodeview.Publish(ctx, svc.js, x.Overlay(node)); err != nil {
			t.Fatal(err)
		}
	}
	// A new leader reads what the stream holds (headers only) to
	// republish only the overlays that differ.
	sums, err := nodeview.HeldSums(ctx, svc.js)
	if err != nil {
		t.Fatalf("inventory cannot read the overlays' sums: %v", err)
	}
	for _, node := range x.Nodes() {
		data, err := nodeview.Encode(x.Overlay(node))
		if err != nil || sums[node] != nodeview.Sum(data) {
			t.Fatalf("overlay sum of %s: %q, want %q (%v)", node, sums[node], nodeview.Sum(data), err)
		}
	}
	if v := svc.violations(); v != 0 {
		t.Fatalf("inventory: %v permission violations doing its job", v)
	}

	agents := map[string]party{}
	for _, node := range []string{"cmp1", "cmp2"} {
		a := b.connect(t, "agent-"+node, nil)
		o, err := nodeview.Fetch(ctx, a.nc, node)
		if err != nil {
			t.Fatalf("agent-%s cannot read its own overlay: %v", node, err)
		}
		if !reflect.DeepEqual(o, x.Overlay(node)) {
			t.Fatalf("agent-%s read another overlay than the service published", node)
		}
		if v := a.violations(); v != 0 {
			t.Fatalf("agent-%s: %v permission violations doing its job", node, v)
		}
		agents[node] = a
	}

	a := agents["cmp1"]
	bare, _ := json.Marshal(map[string]string{"last_by_subj": transport.InventoryNodeSubject("cmp2")})
	forbidden := []struct {
		name string
		do   func(context.Context) error
	}{
		{"direct get of another node's overlay", func(c context.Context) error {
			_, err := nodeview.Fetch(c, a.nc, "cmp2")
			return err
		}},
		{"bare direct get naming another node in the body", func(c context.Context) error {
			_, err := a.nc.RequestWithContext(c, "$JS.API.DIRECT.GET."+transport.InventoryNodesStream, bare)
			return err
		}},
		{"another node's overlays live", func(c context.Context) error {
			sub, err := a.nc.SubscribeSync(transport.InventoryNodeSubject("cmp2"))
			if err != nil {
				return err
			}
			defer func() { _ = sub.Unsubscribe() }()
			return a.nc.FlushWithContext(c) // the refusal is asynchronous: counted
		}},
		{"every overlay live", func(c context.Context) error {
			sub, err := a.nc.SubscribeSync(transport.InventoryNodeRoot + ".*")
			if err != nil {
				return err
			}
			defer func() { _ = sub.Unsubscribe() }()
			return a.nc.FlushWithContext(c)
		}},
		{"a consumer on the overlays", func(c context.Context) error {
			_, err := a.js.OrderedConsumer(c, transport.InventoryNodesStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{transport.InventoryNodeSubject("cmp2")}})
			return err
		}},
		{"publishes an overlay for itself", func(c context.Context) error {
			o := x.Overlay("cmp1")
			o.Ports = nil
			return nodeview.Publish(c, a.js, o)
		}},
	}
	for _, f := range forbidden {
		t.Run(f.name, func(t *testing.T) {
			if err := refused(ctx, a, f.do); err != nil {
				t.Fatalf("agent-cmp1: %v", err)
			}
		})
	}
	// Nothing it tried changed its own overlay.
	o, err := nodeview.Fetch(ctx, agents["cmp2"].nc, "cmp2")
	if err != nil || !reflect.DeepEqual(o, x.Overlay("cmp2")) {
		t.Fatalf("agent-cmp2's overlay after agent-cmp1's attempts: %v", err)
	}
	// A node with no overlay yet is no way around it either.
	if err := refused(ctx, agents["cmp2"], func(c context.Context) error {
		_, err := nodeview.Fetch(c, agents["cmp2"].nc, "cmp3")
		return err
	}); err != nil {
		t.Fatalf("agent-cmp2 reading a node that has no overlay: %v", err)
	}
}

// refused runs do as p and reports an error unless the server refuses
// it as a permission violation (within 10 s; do is cancelled then).
func refused(ctx context.Context, p party, do func(context.Context) error) error {
	before := settled(p)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- do(cctx) }()
	for p.violations() <= before && cctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	err := <-errc
	if p.violations() <= before {
		return fmt.Errorf("not refused as a permission violation (err %v)", err)
	}
	if errors.Is(err, nodeview.ErrNoOverlay) {
		return fmt.Errorf("answered %v, not refused", err)
	}
	return nil
}

// settled is p's violation count once it stops moving (an earlier
// refusal may be counted late).
func settled(p party) float64 {
	before := p.violations()
	for s := time.Now(); time.Since(s) < 100*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if v := p.violations(); v != before {
			before, s = v, time.Now()
		}
	}
	return before
}
