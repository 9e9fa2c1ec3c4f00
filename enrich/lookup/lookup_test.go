package lookup_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/enrich/lookup"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

func counter(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == "tapflow_inventory_lookups_total" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no tapflow_inventory_lookups_total{result=%q}", result)
	return 0
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestServiceDownAgentKeepsAttributing: no inventory serve on the bus.
// Holding a record never waits for the request; the request is counted
// unanswered; the record is released at the end of the window as usual;
// the same MAC is not asked again within the interval.
func TestServiceDownAgentKeepsAttributing(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	if err := os.WriteFile(path, []byte("networks:\n  - {id: n1, project_id: t1}\nports:\n  - {id: p1, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:00:00:01\", device_owner: compute:nova}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ask, err := lookup.NewAsker(srv.NC, lookup.AskerOptions{Timeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"sent", "answered", "unanswered", "dropped"} {
		if g := counter(t, reg, r); g != 0 {
			t.Fatalf("%s %v at start", r, g)
		}
	}
	cfg := enrich.DefaultConfig()
	cfg.Inventory.File = path
	cfg.Inventory.PollInterval = units.Duration(time.Hour)
	cfg.LateBinding.Window = units.Duration(time.Second)
	eng, err := enrich.New(cfg, slog.New(slog.DiscardHandler), reg, enrich.WithUnknownVM(ask.Ask))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	if err := eng.Load(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = ask.Run(ctx) }()
	unknown := schemas.Flow{Direction: "tx", VMMAC: "fa:16:3e:00:00:99", PeerMAC: "fa:16:3e:00:00:01", SrcIP: "10.0.0.9", DstIP: "10.0.0.1", Bytes: 100}
	known := schemas.Flow{Direction: "tx", VMMAC: "fa:16:3e:00:00:01", PeerMAC: "fa:16:3e:00:00:99", SrcIP: "10.0.0.1", DstIP: "10.0.0.9", Bytes: 100}
	start := time.Now()
	for range 100 {
		b := &pipeline.Batch{Records: []schemas.Flow{unknown, known}}
		_ = eng.Apply(ctx, b)
		if len(b.Records) != 1 || b.Records[0].TenantID != "t1" {
			t.Fatalf("known record not attributed at once: %+v", b.Records)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("100 batches took %s: Apply waited for the lookup", d)
	}
	waitFor(t, "unanswered request counted", func() bool { return counter(t, reg, "unanswered") == 1 })
	var released int
	waitFor(t, "held records released at the end of the window", func() bool {
		b := &pipeline.Batch{}
		_ = eng.Apply(ctx, b)
		released += len(b.Records)
		return released == 100
	})
	for r, want := range map[string]float64{"sent": 1, "answered": 0, "unanswered": 1, "dropped": 0} {
		if g := counter(t, reg, r); g != want {
			t.Errorf("%s %v; want %v (one request per MAC per interval)", r, g, want)
		}
	}
}

// TestAskerBounds pushes 20× the MAC table through an Asker whose sender
// is not running: the table and the queue stay bounded, every refused MAC
// is counted, and after the interval the table takes new MACs again.
func TestAskerBounds(t *testing.T) {
	srv := transporttest.Run(t, "")
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	reg := prometheus.NewRegistry()
	ask, err := lookup.NewAsker(srv.NC, lookup.AskerOptions{MaxMACs: 16, Queue: 8, Interval: time.Minute, Timeout: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Registry: reg, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"01:00:5e:00:00:fb", "ff:ff:ff:ff:ff:ff", "nope", ""} {
		ask.Ask(m) // group and bad MACs are never asked
	}
	for i := range 320 {
		ask.Ask(fmt.Sprintf("fa:16:3e:02:%02x:%02x", i>>8, i&0xff))
	}
	if g := counter(t, reg, "dropped"); g != 312 {
		t.Fatalf("dropped %v; want 312 (queue of 8)", g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ask.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "queue sent", func() bool { return counter(t, reg, "unanswered") == 8 })
	// 8 remembered: 8 more fit the table, the rest is refused by the table
	for i := range 160 {
		ask.Ask(fmt.Sprintf("fa:16:3e:03:%02x:%02x", i>>8, i&0xff))
		time.Sleep(time.Millisecond)
	}
	waitFor(t, "second round sent", func() bool { return counter(t, reg, "sent") == 16 })
	if g := counter(t, reg, "dropped"); g != 312+152 {
		t.Fatalf("dropped %v; want %v", g, 312+152)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	ask.Ask("fa:16:3e:02:00:00") // aged out: asked again
	waitFor(t, "re-asked after the interval", func() bool { return counter(t, reg, "sent") == 17 })
}

// TestServerCoalescesAndLimits: the decisions, on a fake clock.
func TestServerCoalescesAndLimits(t *testing.T) {
	now := time.Unix(1000, 0)
	queries := 0
	s, err := lookup.NewServer(func(string) { queries++ }, lookup.ServerOptions{Rate: 1, Burst: 2, Window: 10 * time.Second, MaxMACs: 16, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance time.Duration
		mac     string
		want    string
	}{
		{0, "fa:16:3e:00:00:01", lookup.ReplyQueried},
		{0, "FA:16:3E:00:00:01", lookup.ReplyCoalesced}, // same MAC, other spelling
		{0, "fa:16:3e:00:00:02", lookup.ReplyQueried},
		{0, "fa:16:3e:00:00:03", lookup.ReplyLimited}, // burst 2 spent
		{time.Second, "fa:16:3e:00:00:03", lookup.ReplyQueried},
		{0, "01:00:5e:00:00:fb", lookup.ReplyInvalid},
		{0, "garbage", lookup.ReplyInvalid},
		{11 * time.Second, "fa:16:3e:00:00:01", lookup.ReplyQueried}, // window over
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		if got := s.Handle(st.mac); got != st.want {
			t.Fatalf("step %d %s: %s; want %s", i, st.mac, got, st.want)
		}
	}
	if queries != 4 {
		t.Fatalf("queries %d; want 4", queries)
	}
	// 20× the MAC table through, one per second (within the rate): every
	// one is a query, none is refused for the table's size.
	for i := range 320 {
		now = now.Add(time.Second)
		if got := s.Handle(fmt.Sprintf("fa:16:3e:04:%02x:%02x", i>>8, i&0xff)); got != lookup.ReplyQueried {
			t.Fatalf("MAC %d: %s", i, got)
		}
	}
	if g := testutil.ToFloat64(s.Total(lookup.ReplyQueried)); g != 324 {
		t.Errorf("queried %v", g)
	}
	if _, err := lookup.NewServer(func(string) {}, lookup.ServerOptions{Rate: -1}); err == nil {
		t.Error("negative rate accepted")
	}
}
