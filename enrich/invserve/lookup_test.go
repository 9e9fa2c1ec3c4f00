package invserve

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
)

// countingSource is the file provider, counting its reads of the file.
// With firstDone set, the first read lists the file and then waits for
// firstDone to close before it returns (an openstack cold start).
type countingSource struct {
	f         *inventory.File
	polls     atomic.Int64
	firstDone chan struct{}
}

func (s *countingSource) Poll(ctx context.Context) (*inventory.Inventory, bool, error) {
	n := s.polls.Add(1)
	inv, changed, err := s.f.Poll()
	if n == 1 && s.firstDone != nil {
		select {
		case <-s.firstDone:
		case <-ctx.Done():
		}
	}
	return inv, changed, err
}

// startLookupService runs the service with inventory.refresh 1 h: only
// targeted lookups make it read the file again.
func startLookupService(t *testing.T, js interface{ Conn() *nats.Conn }, srv *transporttest.Server, path string, lo lookup.ServerOptions) (*Service, *countingSource) {
	t.Helper()
	f, err := inventory.NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	src := &countingSource{f: f}
	return startLookupServiceOn(t, srv, src, lo), src
}

func startLookupServiceOn(t *testing.T, srv *transporttest.Server, src *countingSource, lo lookup.ServerOptions) *Service {
	t.Helper()
	s, err := New(Config{Instance: "svc", Lease: 2 * time.Second, PollInterval: time.Hour, Lookup: lo,
		Guard: inventory.DropGuard{MaxDrop: 0.1, ConfirmReads: 3}}, src, srv.JS, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// TestLookupDuringTheFirstRead: a lookup that arrives while the service's
// first read of the cloud is under way (an openstack cold start takes
// minutes) is served by a second read when the first ends: the first may
// have listed the cloud before the port asked about appeared. Before, the
// lookup was dropped and the agent waited for its next ask.
func TestLookupDuringTheFirstRead(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	writeCloud(t, path, 10)
	f, err := inventory.NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	src := &countingSource{f: f, firstDone: make(chan struct{})}
	svc := startLookupServiceOn(t, srv, src, lookup.ServerOptions{})
	waitUntil(t, "the first read under way", func() bool { return src.polls.Load() == 1 })
	writeCloud(t, path, 11) // the port appears after the first read listed the cloud

	nc := connect(t, srv)
	var reply *nats.Msg
	waitUntil(t, "the lookup answered", func() bool { // the subscription comes up with the lease
		reply, err = nc.Request(transport.InventoryLookupSubject, []byte("fa:16:3e:00:00:0a"), 2*time.Second)
		return err == nil
	})
	if got := string(reply.Data); got != lookup.ReplyQueried {
		t.Fatalf("reply %q, want %q", got, lookup.ReplyQueried)
	}
	if n := src.polls.Load(); n != 1 {
		t.Fatalf("%d reads before the first ended; want 1", n)
	}
	close(src.firstDone)
	headWith(t, srv.JS, 11)
	if n := src.polls.Load(); n != 2 {
		t.Errorf("%d reads; want 2: the first, and one for the lookup", n)
	}
	if g := testutil.ToFloat64(svc.lookups.Total(lookup.ReplyQueried)); g != 1 {
		t.Errorf("serve lookups{queried} %v", g)
	}
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(wait); !f(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func connect(t *testing.T, srv *transporttest.Server) *nats.Conn {
	t.Helper()
	nc, err := srv.Embedded.Connect("agent", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestLookupAttributesHeldRecordsWithinTheWindow: a port appears in the
// provider; an agent (provider nats, refresh 1 h) sees its MAC, holds the
// records, asks; the service re-reads at once and the delta lets late
// binding attribute them long before its 60 s window ends.
func TestLookupAttributesHeldRecordsWithinTheWindow(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	writeCloud(t, path, 10)
	svc, src := startLookupService(t, srv.JS, srv, path, lookup.ServerOptions{})
	headWith(t, srv.JS, 10)

	nc := connect(t, srv)
	reg := prometheus.NewRegistry()
	p, err := natsinv.NewProvider(nc, natsinv.Options{StatePath: filepath.Join(t.TempDir(), "inventory.snapshot"), Logger: slog.New(slog.DiscardHandler), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ask, err := lookup.NewAsker(nc, lookup.AskerOptions{Logger: slog.New(slog.DiscardHandler), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	cfg := enrich.DefaultConfig()
	cfg.Inventory.Provider = "nats"
	cfg.Inventory.PollInterval = units.Duration(time.Hour)
	eng, err := enrich.New(cfg, slog.New(slog.DiscardHandler), reg, enrich.WithProvider(p), enrich.WithUnknownVM(ask.Ask))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	if err := eng.Load(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = eng.Run(ctx) }()
	go func() { defer wg.Done(); _ = ask.Run(ctx) }()
	for _, r := range []string{"sent", "answered", "unanswered", "dropped"} {
		if g := counter(t, reg, "tapflow_inventory_lookups_total", r); g != 0 {
			t.Fatalf("lookups{%s} %v at start", r, g)
		}
	}

	base := counter(t, reg, "tapflow_inventory_updates_total", "ok")
	polls := src.polls.Load()
	writeCloud(t, path, 11) // the new VM's port: fa:16:3e:00:00:0a, in the provider, not yet read
	start := time.Now()
	b := &pipeline.Batch{Records: []schemas.Flow{{Direction: "tx", VMMAC: "fa:16:3e:00:00:0a", PeerMAC: "fa:16:3e:00:00:01", SrcIP: "10.0.0.10", DstIP: "10.0.0.11", Bytes: 100}}}
	_ = eng.Apply(ctx, b)
	if len(b.Records) != 0 {
		t.Fatalf("record of an unknown VM not held: %+v", b.Records)
	}
	var got schemas.Flow
	waitUntil(t, "held record attributed", func() bool {
		b := &pipeline.Batch{}
		_ = eng.Apply(ctx, b)
		if len(b.Records) == 1 {
			got = b.Records[0]
			return true
		}
		return false
	})
	took := time.Since(start)
	t.Logf("held record attributed %s after the first sight of the MAC (window 60 s, refresh 1 h)", took.Round(time.Millisecond))
	if got.TenantID != "t1" || got.PortID != "p10" {
		t.Fatalf("released unattributed: tenant %q port %q zone %q", got.TenantID, got.PortID, got.Zone)
	}
	if took > 30*time.Second {
		t.Fatalf("took %s: not well inside the 60 s window", took)
	}
	if n := src.polls.Load() - polls; n != 1 {
		t.Errorf("provider read %d times for one lookup; want 1", n)
	}
	if g := testutil.ToFloat64(svc.lookups.Total(lookup.ReplyQueried)); g != 1 {
		t.Errorf("serve lookups{queried} %v", g)
	}
	for r, want := range map[string]float64{"sent": 1, "answered": 1, "unanswered": 0, "dropped": 0} {
		if g := counter(t, reg, "tapflow_inventory_lookups_total", r); g != want {
			t.Errorf("lookups{%s} %v; want %v", r, g, want)
		}
	}
	// the answer came by the ordinary update path: a delta, or the snapshot
	// when the agent's subscriptions were not up yet
	d, ok := counter(t, reg, "tapflow_inventory_updates_total", "delta"), counter(t, reg, "tapflow_inventory_updates_total", "ok")
	ok -= base
	t.Logf("agent updates: delta %v, snapshot %v", d, ok)
	if d+ok != 1 {
		t.Errorf("agent updates delta %v + ok %v; want 1", d, ok)
	}
}

// counter reads name{result} from reg.
func counter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{result=%q}", name, result)
	return 0
}

// TestLookupCoalescesAcrossAgents: 50 agents ask for one MAC at once: one
// provider read.
func TestLookupCoalescesAcrossAgents(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	writeCloud(t, path, 10)
	svc, src := startLookupService(t, srv.JS, srv, path, lookup.ServerOptions{})
	headWith(t, srv.JS, 10)
	waitUntil(t, "lookups served", func() bool {
		_, err := srv.NC.Request(transport.InventoryLookupSubject, []byte("zz"), time.Second)
		return err == nil
	})
	polls := src.polls.Load()
	writeCloud(t, path, 11)
	var wg sync.WaitGroup
	var answered atomic.Int64
	for range 50 {
		nc := connect(t, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := nc.Request(transport.InventoryLookupSubject, []byte("fa:16:3e:00:00:0a"), 10*time.Second); err == nil {
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	headWith(t, srv.JS, 11)
	time.Sleep(500 * time.Millisecond) // a second read, if one were triggered, would show now
	if answered.Load() != 50 {
		t.Fatalf("answered %d of 50", answered.Load())
	}
	if n := src.polls.Load() - polls; n != 1 {
		t.Errorf("provider read %d times for 50 requests of one MAC; want 1", n)
	}
	if q, c := testutil.ToFloat64(svc.lookups.Total(lookup.ReplyQueried)), testutil.ToFloat64(svc.lookups.Total(lookup.ReplyCoalesced)); q != 1 || c != 49 {
		t.Errorf("queried %v coalesced %v; want 1 and 49", q, c)
	}
}

// TestLookupRateLimitBoundsReads: 500 distinct MACs at once (50 agents ×
// 10) cost at most the bucket's burst in provider reads.
func TestLookupRateLimitBoundsReads(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	writeCloud(t, path, 10)
	svc, src := startLookupService(t, srv.JS, srv, path, lookup.ServerOptions{Rate: 0.01, Burst: 3})
	headWith(t, srv.JS, 10)
	waitUntil(t, "lookups served", func() bool {
		_, err := srv.NC.Request(transport.InventoryLookupSubject, []byte("zz"), time.Second)
		return err == nil
	})
	polls := src.polls.Load()
	var wg sync.WaitGroup
	for a := range 50 {
		nc := connect(t, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				_, _ = nc.Request(transport.InventoryLookupSubject, []byte(fmt.Sprintf("fa:16:3e:01:%02x:%02x", a, i)), 10*time.Second)
			}
		}()
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	q, l := testutil.ToFloat64(svc.lookups.Total(lookup.ReplyQueried)), testutil.ToFloat64(svc.lookups.Total(lookup.ReplyLimited))
	n := src.polls.Load() - polls
	t.Logf("500 distinct MACs: %v queried, %v limited, %d provider reads", q, l, n)
	if q > 4 || q+l != 500 {
		t.Errorf("queried %v limited %v; want at most burst 3 (+1 refilled) of 500", q, l)
	}
	if n < 1 || float64(n) > q {
		t.Errorf("provider reads %d for %v queries", n, q)
	}
}
