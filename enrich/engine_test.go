package enrich

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.Inventory.File = "/etc/tapflow/inventory.yaml"
	cases := []struct {
		name  string
		edit  func(c *Config)
		paths []string
	}{
		{"defaults with a file", func(*Config) {}, nil},
		{"no file", func(c *Config) { c.Inventory.File = "" }, []string{"inventory.file"}},
		{"unknown provider", func(c *Config) { c.Inventory.Provider = "nova" }, []string{"inventory.provider"}},
		{"openstack defaults", func(c *Config) { c.Inventory.Provider = "openstack" }, nil},
		{"openstack noauth without neutron", func(c *Config) {
			c.Inventory.Provider = "openstack"
			c.Inventory.OpenStack.NoAuth = &openstack.NoAuthConfig{Nova: "http://127.0.0.1:8774/v2.1"}
		}, []string{"inventory.openstack.noauth.neutron"}},
		{"openstack bad interface and refresh", func(c *Config) {
			c.Inventory.Provider = "openstack"
			c.Inventory.OpenStack.Interface = "private"
			c.Inventory.Refresh = units.Duration(time.Millisecond)
		}, []string{"inventory.refresh", "inventory.openstack.interface"}},
		{"poll too fast", func(c *Config) { c.Inventory.PollInterval = units.Duration(time.Millisecond) }, []string{"inventory.poll_interval"}},
		{"negative grace", func(c *Config) { c.GhostGrace = -1 }, []string{"ghost_grace"}},
		{"late binding without window", func(c *Config) { c.LateBinding.Window = 0 }, []string{"late_binding.window"}},
		{"late binding off needs no window", func(c *Config) { c.LateBinding = LateBindingConfig{} }, nil},
		{"negative buffer", func(c *Config) { c.LateBinding.MaxRecords = -1 }, []string{"late_binding.max_records"}},
		{"lookup out of range", func(c *Config) {
			c.Inventory.Lookup = LookupConfig{Interval: units.Duration(time.Millisecond), Timeout: units.Duration(2 * time.Minute),
				Window: 0, Rate: -1, Burst: 0}
		}, []string{"inventory.lookup.interval", "inventory.lookup.timeout", "inventory.lookup.window", "inventory.lookup.rate", "inventory.lookup.burst"}},
		{"lookup rate NaN", func(c *Config) { c.Inventory.Lookup.Rate = math.NaN() }, []string{"inventory.lookup.rate"}},
		{"lookup tuned for a test", func(c *Config) {
			c.Inventory.Lookup = LookupConfig{Interval: units.Duration(time.Second), Timeout: units.Duration(time.Second),
				Window: units.Duration(time.Second), Rate: 5, Burst: 10}
		}, nil},
		{"zero hops", func(c *Config) { c.MaxRouteHops = 0 }, []string{"max_route_hops"}},
		{"all at once", func(c *Config) { c.Inventory.File, c.MaxRouteHops = "", 0 }, []string{"inventory.file", "max_route_hops"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			err := cfg.Validate()
			var got []string
			for _, e := range unwrap(err) {
				var fe *units.FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("%v is not a FieldError", e)
				}
				got = append(got, fe.Path)
			}
			if strings.Join(got, ",") != strings.Join(c.paths, ",") {
				t.Errorf("paths %v, want %v (%v)", got, c.paths, err)
			}
		})
	}
}

func unwrap(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

const inv1 = `
networks:
  - {id: n1, name: private, project_id: t1}
  - {id: pub, name: public, "router:external": true}
subnets:
  - {id: s1, network_id: n1, cidr: 10.0.0.0/24, gateway_ip: 10.0.0.1}
routers:
  - {id: r1, project_id: t1, external_gateway_info: {network_id: pub}}
ports:
  - {id: r1-if, network_id: n1, mac_address: "fa:16:3e:00:00:01", device_owner: "network:router_interface", device_id: r1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.1}]}
  - {id: p1, network_id: n1, project_id: t1, mac_address: "fa:16:3e:00:00:10", device_owner: "compute:nova", device_id: vm1, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.10}]}
`

// inv2 adds vm2, whose records arrived before it was known.
const inv2 = inv1 + `  - {id: p2, network_id: n1, project_id: t1, mac_address: "fa:16:3e:00:00:20", device_owner: "compute:nova", device_id: vm2, fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.20}]}
`

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type fixture struct {
	t    *testing.T
	path string
	clk  *clock
	reg  *prometheus.Registry
	e    *Engine
}

func newFixture(t *testing.T, content string, edit func(*Config)) *fixture {
	t.Helper()
	fx := &fixture{t: t, path: filepath.Join(t.TempDir(), "inventory.yaml"), clk: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}, reg: prometheus.NewRegistry()}
	if content != "" {
		fx.write(content)
	}
	cfg := DefaultConfig()
	cfg.Inventory.File = fx.path
	if edit != nil {
		edit(&cfg)
	}
	e, err := New(cfg, slog.New(slog.DiscardHandler), fx.reg, WithClock(fx.clk.now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	fx.e = e
	return fx
}

func (fx *fixture) write(s string) {
	fx.t.Helper()
	tmp := fx.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		fx.t.Fatal(err)
	}
	if err := os.Rename(tmp, fx.path); err != nil {
		fx.t.Fatal(err)
	}
}

func rec(vm, peer, src, dst string) schemas.Flow {
	return schemas.Flow{Direction: "tx", VMMAC: vm, PeerMAC: peer, SrcIP: src, DstIP: dst, Bytes: 100}
}

func (fx *fixture) apply(ctx context.Context, recs ...schemas.Flow) []schemas.Flow {
	fx.t.Helper()
	b := pipeline.NewBatch(recs, nil)
	if err := fx.e.Apply(ctx, b); err != nil {
		fx.t.Fatal(err)
	}
	return b.Records
}

func TestLateBindingFixesZone(t *testing.T) {
	fx := newFixture(t, inv1, nil)
	ctx := context.Background()
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	known := rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:01", "10.0.0.10", "8.8.8.8")
	early := rec("fa:16:3e:00:00:20", "fa:16:3e:00:00:01", "10.0.0.20", "8.8.8.8")
	out := fx.apply(ctx, known, early, early)
	if len(out) != 1 || out[0].TenantID != "t1" || out[0].Zone != "external" || out[0].ExternalNetwork != "public" || out[0].MetadataVersion != 1 {
		t.Fatalf("first batch %+v", out)
	}
	if g := testutil.ToFloat64(fx.e.m.held); g != 2 {
		t.Fatalf("held %v", g)
	}
	fx.write(inv2)
	fx.clk.add(10 * time.Second)
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	out = fx.apply(ctx)
	if len(out) != 2 {
		t.Fatalf("released %d, want 2", len(out))
	}
	for _, f := range out {
		if f.TenantID != "t1" || f.Zone != "external" || f.ServerID != "vm2" || f.MetadataVersion != 2 {
			t.Errorf("late-bound record %+v", f)
		}
	}
	if g := testutil.ToFloat64(fx.e.m.resolved); g != 2 {
		t.Errorf("resolved %v", g)
	}
	if g := testutil.ToFloat64(fx.e.m.records[schemas.ZoneExternal]); g != 3 {
		t.Errorf("external records %v", g)
	}
}

func TestLateBindingWindowFullAndFlush(t *testing.T) {
	fx := newFixture(t, inv1, func(c *Config) { c.LateBinding.MaxRecords = 3 })
	ctx := context.Background()
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	unknown := func(i int) schemas.Flow {
		f := rec("fa:16:3e:00:00:99", "fa:16:3e:00:00:01", "10.0.0.99", "8.8.8.8")
		f.Bytes = int64(i)
		return f
	}
	if out := fx.apply(ctx, unknown(1), unknown(2)); len(out) != 0 {
		t.Fatalf("held records emitted: %+v", out)
	}
	fx.clk.add(30 * time.Second)
	// two more: the buffer holds 3, so the oldest (1) is pushed out
	out := fx.apply(ctx, unknown(3), unknown(4))
	if len(out) != 1 || out[0].Bytes != 1 || out[0].TenantID != "unknown" || out[0].Zone != "miss" {
		t.Fatalf("full: %+v", out)
	}
	fx.clk.add(31 * time.Second) // 2 is 61 s old
	out = fx.apply(ctx)
	if len(out) != 1 || out[0].Bytes != 2 || out[0].Zone != "miss" {
		t.Fatalf("window: %+v", out)
	}
	out = fx.e.Flush()
	if len(out) != 2 || out[0].Zone != "miss" {
		t.Fatalf("flush: %+v", out)
	}
	if testutil.ToFloat64(fx.e.m.releasedFull) != 1 || testutil.ToFloat64(fx.e.m.releasedWindow) != 1 || testutil.ToFloat64(fx.e.m.releasedFlush) != 2 {
		t.Error("release counters")
	}
	// a cancelled context flushes into the batch
	fx.apply(ctx, unknown(5))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if out := fx.apply(cctx, unknown(6)); len(out) != 2 {
		t.Fatalf("shutdown batch %d records, want 2", len(out))
	}
}

func TestLateBindingOff(t *testing.T) {
	fx := newFixture(t, inv1, func(c *Config) { c.LateBinding.MaxRecords = 0 })
	out := fx.apply(context.Background(), rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:01", "10.0.0.10", "8.8.8.8"))
	// not loaded yet: empty snapshot, version 0, emitted at once
	if len(out) != 1 || out[0].TenantID != "unknown" || out[0].Zone != "miss" || out[0].MetadataVersion != 0 {
		t.Fatalf("%+v", out)
	}
}

func TestReloadKeepsLastGoodSnapshot(t *testing.T) {
	fx := newFixture(t, inv1, nil)
	ctx := context.Background()
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fx.e.Load(ctx); err != nil || fx.e.Snapshot().Version() != 1 {
		t.Fatalf("unchanged file rebuilt: v%d %v", fx.e.Snapshot().Version(), err)
	}
	fx.write("ports:\n  - {id: p1, fixed_ips: 5}\n")
	err := fx.e.Load(ctx)
	if err == nil || !strings.Contains(err.Error(), "ports[0] (id p1): fixed_ips") {
		t.Fatalf("bad file: %v", err)
	}
	if v := fx.e.Snapshot().Version(); v != 1 {
		t.Fatalf("bad file replaced the snapshot: v%d", v)
	}
	if g := testutil.ToFloat64(fx.e.m.reloads.WithLabelValues("error")); g != 1 {
		t.Errorf("reload errors %v", g)
	}
	fx.write(inv2 + "  - {id: p-bad, project_id: t1, mac_address: nope, device_owner: compute:nova}\n")
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if v := fx.e.Snapshot().Version(); v != 2 {
		t.Fatalf("version %d", v)
	}
	if g := testutil.ToFloat64(fx.e.m.anomalies.WithLabelValues(snapshot.AnomalyInvalidMAC)); g != 1 {
		t.Errorf("anomaly counter %v", g)
	}
	// the same anomaly in the next snapshot is not counted again
	fx.write(inv1 + "  - {id: p-bad, project_id: t1, mac_address: nope, device_owner: compute:nova}\n")
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if g := testutil.ToFloat64(fx.e.m.anomalies.WithLabelValues(snapshot.AnomalyInvalidMAC)); g != 1 {
		t.Errorf("anomaly counted twice: %v", g)
	}
	// p2 left: it is a ghost, and goes when the grace is over
	if g := fx.e.Snapshot().Stats().Ghosts; g != 1 {
		t.Fatalf("ghosts %d", g)
	}
	fx.clk.add(61 * time.Second)
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if g := fx.e.Snapshot().Stats().Ghosts; g != 0 {
		t.Errorf("expired ghost kept: %d", g)
	}
	if n, err := testutil.GatherAndCount(fx.reg); err != nil || n < 10 {
		t.Errorf("metrics: %d %v", n, err)
	}
}

func TestRun(t *testing.T) {
	fx := newFixture(t, inv1, func(c *Config) { c.Inventory.PollInterval = units.Duration(100 * time.Millisecond) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- fx.e.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for fx.e.Snapshot().Version() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	fx.write(inv2)
	for fx.e.Snapshot().Version() != 2 && time.Now().Before(deadline) {
		// Apply runs concurrently with reloads
		fx.apply(context.Background(), rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:01", "10.0.0.10", "8.8.8.8"))
		time.Sleep(10 * time.Millisecond)
	}
	if v := fx.e.Snapshot().Version(); v != 2 {
		t.Fatalf("version %d after the file changed", v)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := New(DefaultConfig(), nil, prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), "inventory.file") {
		t.Fatalf("%v", err)
	}
}

func TestApplyZeroAllocForKnownRecords(t *testing.T) {
	fx := newFixture(t, inv1, nil)
	if err := fx.e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs := make([]schemas.Flow, 256)
	for i := range recs {
		recs[i] = rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:01", "10.0.0.10", "8.8.8.8")
	}
	s := fx.e.Snapshot()
	w := new(batchWork)
	if a := testing.AllocsPerRun(100, func() { fx.e.attribute(w, s, fx.clk.now(), recs) }); a != 0 {
		t.Errorf("%v allocs per batch", a)
	}
}

// TestApplyZeroAllocHolding: once the late-binding buffer is full and the
// batch state has grown, a batch that holds records (and evicts as many)
// allocates nothing either.
func TestApplyZeroAllocHolding(t *testing.T) {
	fx := newFixture(t, inv1, func(c *Config) { c.LateBinding.MaxRecords = 64 })
	if err := fx.e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	tmpl := make([]schemas.Flow, 256)
	for i := range tmpl {
		tmpl[i] = rec("fa:16:3e:00:00:10", "fa:16:3e:00:00:01", "10.0.0.10", "8.8.8.8")
		if i%8 == 0 { // vm2: not in inv1
			tmpl[i] = rec("fa:16:3e:00:00:20", "fa:16:3e:00:00:01", "10.0.0.20", "8.8.8.8")
		}
	}
	recs := make([]schemas.Flow, len(tmpl))
	s, w := fx.e.Snapshot(), new(batchWork)
	run := func() {
		copy(recs, tmpl)
		if out := fx.e.attribute(w, s, fx.clk.now(), recs); len(out) != len(tmpl) {
			t.Fatalf("%d records out of %d", len(out), len(tmpl))
		}
	}
	for range 3 { // fill the buffer: 32 held per batch
		copy(recs, tmpl)
		fx.e.attribute(w, s, fx.clk.now(), recs)
	}
	if a := testing.AllocsPerRun(100, run); a != 0 {
		t.Errorf("%v allocs per batch", a)
	}
}

// TestLateBindingMulticast: multicast from (or to) a VM whose port is not
// yet known is held like any other record and attributed in full once the
// port appears; received multicast names its VM by the tap. Multicast that
// can never bind (a group MAC on the VM side and no tap) is not held, and an
// expired multicast record stays multicast.
func TestLateBindingMulticast(t *testing.T) {
	fx := newFixture(t, inv1, nil)
	ctx := context.Background()
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	sent := rec("fa:16:3e:00:00:20", "01:00:5e:00:00:fb", "10.0.0.20", "224.0.0.251")
	recv := schemas.Flow{Direction: "rx", VMMAC: "01:00:5e:00:00:fb", PeerMAC: "fa:16:3e:00:00:10", SrcIP: "10.0.0.10", DstIP: "224.0.0.251", Ifname: "tapp2", Bytes: 100}
	noTap := recv
	noTap.Ifname = ""
	out := fx.apply(ctx, sent, recv, noTap)
	if len(out) != 1 || out[0].Ifname != "" || out[0].Zone != "multicast" || out[0].TenantID != "unknown" {
		t.Fatalf("first batch (only the unbindable record passes): %+v", out)
	}
	if g := testutil.ToFloat64(fx.e.m.held); g != 2 {
		t.Fatalf("held %v, want 2", g)
	}
	fx.write(inv2)
	fx.clk.add(5 * time.Second)
	if err := fx.e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	out = fx.apply(ctx)
	if len(out) != 2 {
		t.Fatalf("released %d, want 2", len(out))
	}
	for _, f := range out {
		if f.TenantID != "t1" || f.ServerID != "vm2" || f.PortID != "p2" || f.Zone != "multicast" || f.MetadataVersion != 2 {
			t.Errorf("late-bound multicast %+v", f)
		}
	}
	// never bound: released at the end of the window, still multicast
	ghost := rec("fa:16:3e:00:00:77", "33:33:00:00:00:01", "fe80::1", "ff02::1")
	if out := fx.apply(ctx, ghost); len(out) != 0 {
		t.Fatalf("not held: %+v", out)
	}
	before := testutil.ToFloat64(fx.e.m.records[schemas.ZoneMulticast])
	fx.clk.add(61 * time.Second)
	out = fx.apply(ctx)
	if len(out) != 1 || out[0].Zone != "multicast" || out[0].TenantID != "unknown" {
		t.Fatalf("window release %+v", out)
	}
	if g := testutil.ToFloat64(fx.e.m.records[schemas.ZoneMulticast]) - before; g != 1 {
		t.Errorf("multicast records counted %v, want 1", g)
	}
}
