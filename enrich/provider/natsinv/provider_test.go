package natsinv

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
	"github.com/tapflow/tapflow/transport"
)

const wait = 30 * time.Second // generous: CI is loaded

func cloud(tenants int) *inventory.Inventory {
	return synth.Generate(synth.Options{Tenants: tenants, VMsPerTenant: 4, LoadBalancers: 1})
}

type env struct {
	t   *testing.T
	srv *transporttest.Server
	obs jetstream.ObjectStore
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := transporttest.Run(t, "")
	obs, err := EnsureStore(context.Background(), srv.JS, StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, srv: srv, obs: obs}
}

func (e *env) publish(inv *inventory.Inventory) Published {
	e.t.Helper()
	res, err := Publish(context.Background(), e.obs, inv, time.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// putRaw writes an object as a foreign or broken writer would.
func (e *env) putRaw(h nats.Header, data []byte) {
	e.t.Helper()
	if _, err := e.obs.Put(context.Background(), jetstream.ObjectMeta{Name: transport.InventoryObject, Headers: h}, bytes.NewReader(data)); err != nil {
		e.t.Fatal(err)
	}
}

type agent struct {
	p      *Provider
	reg    *prometheus.Registry
	state  string
	cancel context.CancelFunc
	done   chan struct{}
}

func startAgent(t *testing.T, nc *nats.Conn, state string, run bool) *agent {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := NewProvider(nc, Options{StatePath: state, Resync: 500 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{p: p, reg: reg, state: state, cancel: func() {}, done: make(chan struct{})}
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		go func() { defer close(a.done); _ = p.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-a.done })
	}
	return a
}

// poll polls until the provider returns version want (or fails).
func (a *agent) pollFor(t *testing.T, want uint64) *inventory.Inventory {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		inv, changed, err := a.p.Poll(ctx)
		if err != nil {
			t.Fatalf("poll for version %d: %v (held %+v)", want, err, a.p.Current())
		}
		if changed && a.p.Current().Version == want {
			return inv
		}
		select {
		case <-ctx.Done():
			t.Fatalf("version %d not reached; held %d", want, a.p.Current().Version)
		case <-a.p.Updates():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (a *agent) count(result string) float64 {
	return testutil.ToFloat64(a.p.updatesTotal.WithLabelValues(result))
}

func TestColdStartWatchPersistAndRestartWithoutNATS(t *testing.T) {
	e := newEnv(t)
	state := filepath.Join(t.TempDir(), "agent", "inventory.snapshot")
	if r := e.publish(cloud(20)); r.Version != 1 || r.Skipped {
		t.Fatalf("first publish %+v", r)
	}
	a := startAgent(t, e.srv.NC, state, true)
	if g := testutil.ToFloat64(a.p.versionG); g != 0 {
		t.Fatalf("version gauge %v before the first snapshot", g)
	}
	if inv := a.pollFor(t, 1); len(inv.Ports) != len(cloud(20).Ports) {
		t.Fatalf("ports %d", len(inv.Ports))
	}
	if r := e.publish(cloud(20)); !r.Skipped || r.Version != 1 {
		t.Fatalf("same content published again: %+v", r)
	}
	e.publish(cloud(30))
	inv := a.pollFor(t, 2)
	if len(inv.Ports) != len(cloud(30).Ports) {
		t.Fatalf("ports %d", len(inv.Ports))
	}
	if age := a.p.age(); age < 0 || age > 60 {
		t.Errorf("age %v", age)
	}
	// the local copy is private and current
	deadline := time.Now().Add(wait)
	for {
		s, err := readState(state)
		if err == nil && s.Version == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local copy not at version 2: %+v %v", s, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fi, err := os.Stat(state)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state mode %v %v", fi.Mode(), err)
	}
	// restart with NATS gone: the copy attributes at once
	url := e.srv.ClientURL()
	_ = e.srv.Close()
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b := startAgent(t, nc, state, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	inv, changed, err := b.p.Poll(ctx)
	if err != nil || !changed || len(inv.Ports) != len(cloud(30).Ports) || b.p.Current().Version != 2 {
		t.Fatalf("restart without NATS: changed=%v err=%v", changed, err)
	}
	if age := b.p.age(); age < 0 {
		t.Errorf("age %v after a restart from the copy", age)
	}
}

func TestBadSnapshotsKeepTheLastGood(t *testing.T) {
	good := func(v uint64) nats.Header {
		return headers(&Snapshot{Version: v, FetchedAt: time.Now(), Digest: "x", Inv: &inventory.Inventory{}})
	}
	cases := []struct {
		name   string
		put    func(e *env)
		result string
	}{
		{"body that does not decode", func(e *env) { e.putRaw(good(2), []byte("not zstd at all")) }, "decode_error"},
		{"zstd of garbage", func(e *env) { e.putRaw(good(2), encoder.EncodeAll([]byte("not gob"), nil)) }, "decode_error"},
		{"foreign headers", func(e *env) { e.putRaw(nats.Header{"X": []string{"y"}}, []byte("{}")) }, "decode_error"},
		{"version older than held", func(e *env) {
			data, _, _ := Encode(cloud(3))
			e.putRaw(good(1), data) // version 1 < 5 held
		}, "out_of_order"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			state := filepath.Join(t.TempDir(), "inventory.snapshot")
			first := cloud(10)
			data, digest, _ := Encode(first)
			held := uint64(1)
			if c.result == "out_of_order" {
				held = 5
			}
			e.putRaw(headers(&Snapshot{Version: held, FetchedAt: time.Now(), Digest: digest, Inv: first}), data)
			a := startAgent(t, e.srv.NC, state, true)
			a.pollFor(t, held)
			c.put(e)
			deadline := time.Now().Add(wait)
			for a.count(c.result) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s not counted", c.result)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if v := a.p.Current().Version; v != held || len(a.p.Current().Inv.Ports) != len(first.Ports) {
				t.Fatalf("bad snapshot replaced the held one: version %d", v)
			}
			if a.count("ok") != 1 {
				t.Errorf("ok %v", a.count("ok"))
			}
			// recovers by itself with the next good publish
			next := cloud(12)
			data, digest, _ = Encode(next)
			e.putRaw(headers(&Snapshot{Version: held + 1, FetchedAt: time.Now(), Digest: digest, Inv: next}), data)
			if inv := a.pollFor(t, held+1); len(inv.Ports) != len(next.Ports) {
				t.Fatalf("ports %d", len(inv.Ports))
			}
		})
	}
}

func TestNATSDownAndBack(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t)
	e.publish(cloud(10))
	url := e.srv.ClientURL()
	port := url[strings.LastIndex(url, ":")+1:]
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a := startAgent(t, nc, filepath.Join(dir, "inventory.snapshot"), true)
	a.pollFor(t, 1)
	store := e.srv.Dir
	_ = e.srv.Close()
	time.Sleep(time.Second) // watch and resync fail meanwhile
	if a.p.Current().Version != 1 {
		t.Fatal("snapshot lost while NATS is down")
	}
	// the same server comes back (same store, same port) and the service publishes
	emb, err := transport.NewEmbedded(store, "127.0.0.1:"+port, "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := emb.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	snc, err := emb.Connect("svc", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(snc.Close)
	js, _ := jetstream.New(snc)
	obs, err := EnsureStore(context.Background(), js, StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Publish(context.Background(), obs, cloud(11), time.Now()); err != nil {
		t.Fatal(err)
	}
	if inv := a.pollFor(t, 2); len(inv.Ports) != len(cloud(11).Ports) {
		t.Fatalf("ports %d", len(inv.Ports))
	}
}

// The bucket holds one snapshot however many versions go through it.
func TestBucketHoldsOneSnapshot(t *testing.T) {
	e := newEnv(t)
	var one int
	for i := range 30 {
		one = e.publish(cloud(200 + i)).Bytes
	}
	st, err := e.obs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > uint64(3*one) {
		t.Fatalf("bucket %d bytes after 30 versions of ~%d", st.Size(), one)
	}
	if h, ok, err := Head(context.Background(), e.obs); err != nil || !ok || h.Version != 30 {
		t.Fatalf("head %+v %v %v", h, ok, err)
	}
}

func TestPollWaitsForTheFirstSnapshot(t *testing.T) {
	e := newEnv(t)
	a := startAgent(t, e.srv.NC, filepath.Join(t.TempDir(), "s"), false)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, _, err := a.p.Poll(ctx); err == nil || !strings.Contains(err.Error(), "no snapshot yet") {
		t.Fatalf("poll without a snapshot: %v", err)
	}
	go func() { time.Sleep(300 * time.Millisecond); e.publish(cloud(5)) }()
	a.pollFor(t, 1)
}

func TestStateFileRejectsDamage(t *testing.T) {
	dir := t.TempDir()
	inv := cloud(5)
	data, digest, _ := Encode(inv)
	path := filepath.Join(dir, "s")
	if err := writeState(path, &Snapshot{Version: 3, FetchedAt: time.Now(), Digest: digest, Inv: inv}, data); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	for _, c := range []struct {
		name string
		data []byte
	}{{"empty", nil}, {"bad magic", append([]byte("XXXXXX\n"), raw[7:]...)}, {"truncated", raw[:len(raw)/2]}} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name)
			_ = os.WriteFile(p, c.data, 0o600)
			if _, err := readState(p); err == nil || !strings.Contains(err.Error(), "rewritten from NATS") {
				t.Fatalf("damaged copy: %v", err)
			}
		})
	}
	s, err := readState(path)
	if err != nil || s.Version != 3 || len(s.Inv.Ports) != len(inv.Ports) {
		t.Fatalf("good copy: %+v %v", s, err)
	}
}

// An unchanged cloud is not republished, but each read of it is
// announced, so the agent's age measures the time since the last read.
func TestAgeFollowsReadsOfAnUnchangedCloud(t *testing.T) {
	e := newEnv(t)
	if _, err := Publish(context.Background(), e.obs, cloud(5), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, e.srv.NC, filepath.Join(t.TempDir(), "s"), true)
	a.pollFor(t, 1)
	if age := a.p.age(); age < 3500 {
		t.Fatalf("age %v, want about an hour", age)
	}
	for _, m := range []*nats.Msg{CurrentMsg(7, time.Now()), CurrentMsg(1, time.Now())} {
		if err := e.srv.NC.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(wait)
	for a.p.age() > 60 {
		if time.Now().After(deadline) {
			t.Fatalf("age %v after a current note", a.p.age())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a.p.Current().Version != 1 {
		t.Fatalf("version %d", a.p.Current().Version)
	}
}

// staleHead is the real store whose head read returns the version before
// for the next stale reads: what an agent reads when the server delivers
// a put's announcement before its stream has stored the put.
type staleHead struct {
	jetstream.ObjectStore
	mu    sync.Mutex
	old   *jetstream.ObjectInfo // the head before the put
	stale int                   // head reads left that return old
	reads int                   // head reads since armed
}

func (s *staleHead) arm(old *jetstream.ObjectInfo, stale int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.old, s.stale, s.reads = old, stale, 0
}

func (s *staleHead) GetInfo(ctx context.Context, name string, opts ...jetstream.GetObjectInfoOpt) (*jetstream.ObjectInfo, error) {
	s.mu.Lock()
	s.reads++
	old := s.old
	if s.stale > 0 && old != nil {
		s.stale--
		s.mu.Unlock()
		return old, nil
	}
	s.mu.Unlock()
	return s.ObjectStore.GetInfo(ctx, name, opts...)
}

func (s *staleHead) readCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// TestAnnouncementAheadOfTheStore: the server hands a put's announcement
// to subscribers before its stream stores the put, so the head read the
// announcement triggers can still show the version before (seen in CI: a
// targeted lookup's answer waited 30 s for the resync). The agent reads
// the head again shortly, a bounded number of times; the resync (1 h
// here) is not what brings the new version.
func TestAnnouncementAheadOfTheStore(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stale     int  // head reads after the put that still show the version before
		reached   bool // version 2 held without a resync
		wantReads int  // head reads after the put; 0: not checked
	}{
		{name: "store in step", stale: 0, reached: true},
		{name: "store one read behind", stale: 1, reached: true},
		{name: "store three reads behind", stale: 3, reached: true, wantReads: 4},
		{name: "store never catches up", stale: 1 << 20, reached: false, wantReads: 1 + announceRetries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.publish(cloud(20))
			old, err := e.obs.GetInfo(context.Background(), transport.InventoryObject)
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			p, err := NewProvider(e.srv.NC, Options{StatePath: filepath.Join(t.TempDir(), "inventory.snapshot"), Resync: time.Hour,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registry: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			head := &staleHead{}
			p.lagging = func(o jetstream.ObjectStore) jetstream.ObjectStore { head.ObjectStore = o; return head }
			a := &agent{p: p}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = p.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			a.pollFor(t, 1)
			// the watch is up once it has read the head (the subscriptions come first)
			for deadline := time.Now().Add(wait); head.readCount() == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the watch never read the head")
				}
			}
			head.arm(old, tc.stale)
			e.publish(cloud(30))

			// every re-read is made within announceRetryFirst × 2^announceRetries
			budget := announceRetryFirst<<announceRetries + 2*time.Second
			deadline := time.Now().Add(budget)
			for p.heldVersion() != 2 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := p.heldVersion() == 2; got != tc.reached {
				t.Fatalf("version 2 held after %s: %v, want %v (head reads %d)", budget, got, tc.reached, head.readCount())
			}
			if tc.wantReads != 0 {
				time.Sleep(3 * announceRetryFirst) // nothing more is read
				if n := head.readCount(); n != tc.wantReads {
					t.Errorf("head read %d times after the put; want %d", n, tc.wantReads)
				}
			}
			gaveUp := strings.Contains(logs.String(), "an announced inventory version is not in the store")
			if gaveUp == tc.reached {
				t.Errorf("warning logged %v; want %v:\n%s", gaveUp, !tc.reached, logs.String())
			}
		})
	}
}

// TestAnnouncedVersion: the version an announcement names, 0 for what is
// not one of ours.
func TestAnnouncedVersion(t *testing.T) {
	info := func(h nats.Header) []byte {
		b, err := json.Marshal(jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: transport.InventoryObject, Headers: h}, NUID: "x"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := nats.Header{}
	good.Set(hdrFormat, Format)
	good.Set(hdrVersion, "7")
	good.Set(hdrFetched, time.Unix(1700000000, 0).UTC().Format(time.RFC3339Nano))
	wrongFormat := nats.Header{}
	for k, v := range good {
		wrongFormat[k] = v
	}
	wrongFormat.Set(hdrFormat, "other")
	for _, tc := range []struct {
		name string
		data []byte
		want uint64
	}{
		{"ours", info(good), 7},
		{"another format", info(wrongFormat), 0},
		{"no headers", info(nil), 0},
		{"not JSON", []byte("\x00\xff"), 0},
		{"empty", nil, 0},
		{"headers of the wrong type", []byte(`{"headers":"x"}`), 0},
	} {
		if got := announcedVersion(tc.data); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// syncBuffer is a bytes.Buffer a logger and the test may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
