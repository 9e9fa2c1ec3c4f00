package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/synthetic"
)

// TestAgentAttributesFromInventoryServe: `tapflow inventory serve` reads
// the (synthetic) cloud from a file and publishes it; an agent with
// inventory.provider nats and no inventory of its own attributes every
// record from it, keeps a private local copy, and a restart with NATS gone
// still attributes from that copy.
func TestAgentAttributesFromInventoryServe(t *testing.T) {
	srv := transporttest.Run(t, "")
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Metrics.Listen = ""
	src, err := synthetic.New(cfg.Synthetic, synthetic.Options{Node: cfg.Node, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	want := snapshot.Build(src.Inventory(), snapshot.Options{Version: 1}).Stats()
	var b bytes.Buffer
	if err := openstack.WriteInventory(&b, src.Inventory()); err != nil {
		t.Fatal(err)
	}
	invPath := filepath.Join(dir, "cloud.yaml")
	if err := os.WriteFile(invPath, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	scfg := cfg
	scfg.NATS.URL = srv.ClientURL()
	scfg.Inventory.Provider, scfg.Inventory.File = "file", invPath
	sctx, stopServe := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- RunInventoryServe(sctx, scfg, quiet) }()
	t.Cleanup(func() { stopServe(); <-served })

	acfg := cfg
	acfg.Inventory.Provider = "nats"
	runAgent := func(nc *nats.Conn) (attributed, miss float64) {
		t.Helper()
		rt := newRT(t, srv.JS)
		rt.nc = nc
		reg := obs.NewRegistry()
		rt.reg = reg
		a, err := newAgent(acfg, rt)
		if err != nil {
			t.Fatal(err)
		}
		c := &counter{}
		a.runner, err = pipeline.NewRunner(pipeline.Config{Name: "agent"}, a.source, []pipeline.Transform{a.engine, c}, pipelineSink{}, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		// Not a fixed 3 s run: the inventory load (a snapshot over NATS)
		// and the first batch can take that long on a loaded box, and a
		// stop inside Load fails the run. Two seconds once records flow.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		runDone := make(chan error, 1)
		go func() { runDone <- a.Run(ctx) }()
		for deadline := time.Now().Add(2 * time.Minute); c.records.Load() == 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("no records 2 min after the agent started (run: %v)", <-runDone)
			}
		}
		time.Sleep(2 * time.Second)
		cancel()
		if err := <-runDone; err != nil {
			t.Fatal(err)
		}
		if got := a.engine.Snapshot().Stats(); got.Endpoints != want.Endpoints || got.AmphoraMACs != want.AmphoraMACs {
			t.Fatalf("agent snapshot %+v, want %+v", got, want)
		}
		if c.records.Load() == 0 {
			t.Fatal("no records")
		}
		if v := gauge(t, reg, "tapflow_inventory_snapshot_version"); v < 1 {
			t.Fatalf("not attributed from the service's snapshot: version %v", v)
		}
		return float64(c.records.Load()), zoneCount(t, reg, "miss")
	}
	if n, miss := runAgent(srv.NC); n == 0 || miss > n*0.2 {
		t.Fatalf("records %v, miss %v", n, miss)
	}
	fi, err := os.Stat(acfg.InventoryStatePath())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("local copy: %v %v", fi, err)
	}
	// NATS and the service gone: the restarted agent attributes from its copy.
	stopServe()
	<-served
	served <- nil
	url := srv.ClientURL()
	_ = srv.Close()
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	runAgent(nc)
}

// pipelineSink acks every batch (the test looks at attribution, not delivery).
type pipelineSink struct{}

func (pipelineSink) Name() string { return "discard" }
func (pipelineSink) Run(_ context.Context, in <-chan *pipeline.Batch) error {
	for b := range in {
		b.Ack(nil)
	}
	return nil
}

func gauge(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func zoneCount(t *testing.T, reg prometheus.Gatherer, zone string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tapflow_enrich_records_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "zone" && l.GetValue() == zone {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestAgentAttributesFromNodeViews: with inventory.scope: node on the
// service and the agent, the agent attributes from its node's view: every
// VM of the (synthetic, one-node) cloud with its real server and port ids,
// as from the whole inventory.
func TestAgentAttributesFromNodeViews(t *testing.T) {
	srv := transporttest.Run(t, "")
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Metrics.Listen = ""
	src, err := synthetic.New(cfg.Synthetic, synthetic.Options{Node: cfg.Node, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inv := *src.Inventory()
	inv.Ports = slices.Clone(inv.Ports)
	for i := range inv.Ports {
		if snapshot.IsVMPort(inv.Ports[i].DeviceOwner) {
			inv.Ports[i].BindingHostID = cfg.Node
		}
	}
	whole := snapshot.Build(&inv, snapshot.Options{Version: 1})
	var b bytes.Buffer
	if err := openstack.WriteInventory(&b, &inv); err != nil {
		t.Fatal(err)
	}
	invPath, keyPath := filepath.Join(dir, "cloud.yaml"), filepath.Join(dir, "views.key")
	if err := os.WriteFile(invPath, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, []byte("a pseudonym key of 32 bytes, ok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	scfg := cfg
	scfg.NATS.URL = srv.ClientURL()
	scfg.Inventory.Provider, scfg.Inventory.File, scfg.Inventory.Scope, scfg.Inventory.Serve.KeyFile = "file", invPath, "node", keyPath
	sctx, stopServe := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- RunInventoryServe(sctx, scfg, quiet) }()
	t.Cleanup(func() { stopServe(); <-served })

	acfg := cfg
	acfg.Inventory.Provider, acfg.Inventory.Scope = "nats", "node"
	runAgent := func(nc *nats.Conn) {
		t.Helper()
		rt := newRT(t, srv.JS)
		rt.nc = nc
		rt.reg = obs.NewRegistry()
		a, err := newAgent(acfg, rt)
		if err != nil {
			t.Fatal(err)
		}
		a.runner, err = pipeline.NewRunner(pipeline.Config{Name: "agent"}, a.source, []pipeline.Transform{a.engine}, pipelineSink{}, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		go func() { runDone <- a.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-runDone; err != nil {
				t.Error(err)
			}
		}()
		checkNodeView(t, a, &inv, whole)
	}
	runAgent(srv.NC)
	fi, err := os.Stat(acfg.InventoryStatePath() + ".overlay")
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept overlay: %v %v", fi, err)
	}
	// NATS and the service gone: the restarted agent attributes from
	// its kept shared view and overlay.
	stopServe()
	<-served
	served <- nil
	url := srv.ClientURL()
	_ = srv.Close()
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	runAgent(nc)
}

// checkNodeView waits until a's snapshot has every endpoint of whole and
// checks each VM port of inv attributes as in whole.
func checkNodeView(t *testing.T, a *agent, inv *inventory.Inventory, whole *snapshot.Snapshot) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if s := a.engine.Snapshot(); s != nil && s.Stats().Endpoints == whole.Stats().Endpoints {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent holds no snapshot of its node's view 2 min after it started")
		}
	}
	s := a.engine.Snapshot()
	now := time.Now().UnixMicro()
	n := 0
	for _, p := range inv.Ports {
		mac, ok := snapshot.ParseMAC(p.MACAddress)
		if !ok || !snapshot.IsVMPort(p.DeviceOwner) {
			continue
		}
		got, ok1 := s.Endpoint(mac, now)
		want, ok2 := whole.Endpoint(mac, now)
		if ok1 != ok2 || (ok1 && (got.ServerID != want.ServerID || got.PortID != want.PortID || got.TenantID != want.TenantID)) {
			t.Fatalf("port %s: agent %+v, whole inventory %+v", p.ID, got, want)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no VM port checked")
	}
}
