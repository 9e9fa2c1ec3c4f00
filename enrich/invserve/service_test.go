package invserve

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/transport"
)

const wait = 30 * time.Second

// fileSource is the file provider as `tapflow inventory serve` uses it.
type fileSource struct{ f *inventory.File }

func (s fileSource) Poll(context.Context) (*inventory.Inventory, bool, error) { return s.f.Poll() }

func writeCloud(t *testing.T, path string, ports int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("networks:\n  - {id: n1, project_id: t1}\nports:\n")
	for i := range ports {
		fmt.Fprintf(&b, "  - {id: p%d, network_id: n1, project_id: t1, mac_address: \"fa:16:3e:00:%02x:%02x\", device_owner: compute:nova}\n", i, i>>8, i&0xff)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type inst struct {
	s      *Service
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

func start(t *testing.T, js jetstream.JetStream, path, id string) *inst {
	t.Helper()
	f, err := inventory.NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(Config{Instance: id, Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond,
		Guard: inventory.DropGuard{MaxDrop: 0.1, ConfirmReads: 1000}}, fileSource{f}, js, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &inst{s: s, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(in.done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-in.done })
	return in
}

func (in *inst) leader() bool { return testutil.ToFloat64(in.s.leader) == 1 }

func headWith(t *testing.T, js jetstream.JetStream, ports int) natsinv.Snapshot {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		obs, err := js.ObjectStore(context.Background(), transport.InventoryBucket)
		if err == nil {
			if data, err := obs.GetBytes(context.Background(), transport.InventoryObject); err == nil {
				inv, err := natsinv.Decode(data)
				h, _, herr := natsinv.Head(context.Background(), obs)
				if err == nil && herr == nil && len(inv.Ports) == ports {
					return h
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot with %d ports published", ports)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOneLeaderPublishesAndAnotherTakesOver(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	writeCloud(t, path, 100)
	a := start(t, srv.JS, path, "a")
	if h := headWith(t, srv.JS, 100); h.Version != 1 {
		t.Fatalf("version %d", h.Version)
	}
	b := start(t, srv.JS, path, "b")
	time.Sleep(3 * time.Second) // more than a lease: b must stay standby
	if !a.leader() || b.leader() {
		t.Fatalf("leaders a=%v b=%v", a.leader(), b.leader())
	}
	if h := headWith(t, srv.JS, 100); h.Version != 1 {
		t.Fatalf("standby republished: version %d", h.Version)
	}
	if g := testutil.ToFloat64(b.s.published.WithLabelValues("ok")); g != 0 {
		t.Fatalf("standby published %v", g)
	}
	a.cancel()
	<-a.done
	writeCloud(t, path, 105)
	if h := headWith(t, srv.JS, 105); h.Version != 2 {
		t.Fatalf("after takeover: version %d", h.Version)
	}
	if !b.leader() {
		t.Fatal("b not leader after a stopped")
	}
}

func TestServiceHoldsABigDrop(t *testing.T) {
	srv := transporttest.Run(t, "")
	path := filepath.Join(t.TempDir(), "inv.yaml")
	writeCloud(t, path, 100)
	a := start(t, srv.JS, path, "a")
	headWith(t, srv.JS, 100)
	if g := testutil.ToFloat64(a.s.held); g != 0 {
		t.Fatalf("held %v at start", g)
	}
	writeCloud(t, path, 20)
	deadline := time.Now().Add(wait)
	for testutil.ToFloat64(a.s.held) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("drop not held")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h := headWith(t, srv.JS, 100); h.Version != 1 {
		t.Fatalf("held drop published: version %d", h.Version)
	}
	if !a.s.ConfirmDrop() {
		t.Fatal("ConfirmDrop: nothing held")
	}
	if h := headWith(t, srv.JS, 20); h.Version != 2 {
		t.Fatalf("confirmed drop: version %d", h.Version)
	}
	if g := testutil.ToFloat64(a.s.confirmed.WithLabelValues("operator")); g != 1 {
		t.Errorf("confirmed{operator} %v", g)
	}
	if a.s.ConfirmDrop() {
		t.Error("ConfirmDrop with nothing held")
	}
}
