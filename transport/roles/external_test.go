package roles_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/enrich/invserve"
	"github.com/tapflow/tapflow/enrich/provider/natsinv"
	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/ordered"
	"github.com/tapflow/tapflow/transport/roles"
)

// TestRolesOnExternalServer runs every role against Debian's nats-server
// (the oldest server tapflow supports) configured with exactly the
// configuration docs/security.md shows (read from the doc, only paths,
// port and passwords filled in), and with the same configuration
// generated for a collector whose durable is not the default: each role
// does its job, and everything a role must not do is refused by the
// server as a permission violation.
func TestRolesOnExternalServer(t *testing.T) {
	bin, version := chaos.DebianNATS(t)
	t.Logf("nats-server %s", version)
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
	documented, _, _ := strings.Cut(rest, "```")
	custom := roles.Example()
	for i := range custom.Users {
		if custom.Users[i].Role == roles.Collector {
			custom.Users[i].Durable = "billing" // issue 25: a custom collector.durable
		}
	}
	for _, c := range []struct {
		name, conf, durable string
	}{
		{"documented", documented, transport.DefaultDurable},
		{"custom durable", custom.Render(), "billing"},
	} {
		t.Run(c.name, func(t *testing.T) { runRoles(t, startExternal(t, bin, c.conf), c.durable) })
	}
}

// TestRolesOnEmbeddedServer runs the same jobs and forbidden actions
// against the embedded server (tapflow run with nats.listen and
// nats.server.users) holding the doc's users, with collector.durable at
// its default and custom: issue 25's subscriber redirected a custom-named
// collector durable there.
func TestRolesOnEmbeddedServer(t *testing.T) {
	for _, durable := range []string{transport.DefaultDurable, "billing"} {
		t.Run(durable, func(t *testing.T) {
			dir := t.TempDir()
			b := &bus{pki: transporttest.NewPKI(t, dir), dir: dir, log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
			cfg := transport.DefaultConfig()
			cfg.Listen = "127.0.0.1:0"
			cfg.Collector.Durable = durable
			cfg.Server.TLS = transport.ServerTLS{CertFile: b.pki.ServerCert, KeyFile: b.pki.ServerKey, CAFile: b.pki.CA}
			for _, u := range roles.Example().Users {
				pw := filepath.Join(dir, "server-"+u.Name+".pw")
				if err := os.WriteFile(pw, []byte("pw-"+u.Name+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				// The collector's user names no durable: it gets collector.durable.
				cfg.Server.Users = append(cfg.Server.Users, transport.ServerUser{User: u.Name, PasswordFile: pw, Role: string(u.Role), Node: u.Node, Ordered: u.Ordered, OrderedSlots: u.Slots,
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
			runRoles(t, b, durable)
		})
	}
}

// bus is an external nats-server and how each user connects to it.
type bus struct {
	url string
	pki transporttest.PKI
	dir string
	log *slog.Logger
}

// startExternal writes conf with the test's paths, port and passwords in
// place of the doc's, starts bin with it and waits until it serves TLS.
func startExternal(t *testing.T, bin, conf string) *bus {
	t.Helper()
	dir := t.TempDir()
	b := &bus{pki: transporttest.NewPKI(t, dir), dir: dir, log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ex := roles.Example()
	r := strings.NewReplacer("listen: "+ex.Listen+"\n", "listen: "+addr+"\n",
		strconv.Quote(ex.CertFile), strconv.Quote(b.pki.ServerCert), strconv.Quote(ex.KeyFile), strconv.Quote(b.pki.ServerKey),
		strconv.Quote(ex.CAFile), strconv.Quote(b.pki.CA), strconv.Quote(ex.StoreDir), strconv.Quote(filepath.Join(dir, "js")))
	filled := r.Replace(conf)
	for _, want := range []string{addr, b.pki.ServerCert, b.pki.ServerKey, b.pki.CA} {
		if !strings.Contains(filled, want) {
			t.Fatalf("the configuration did not take %s:\n%s", want, filled)
		}
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(filled), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, u := range ex.Users {
		t.Setenv(roles.PasswordVar(u.Name), "pw-"+u.Name) // read by nats-server at start
	}
	logf, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("nats-server log:\n%s", out)
		}
	})
	b.url = "tls://" + addr
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			out, _ := os.ReadFile(logf.Name())
			t.Fatalf("nats-server exited at start:\n%s", out)
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nats-server not listening after 1m")
		}
	}
	return b
}

// client is user's configuration: the doc's client side (TLS with a
// client certificate, user and password file, its own inbox).
func (b *bus) client(t *testing.T, user string) transport.Config {
	t.Helper()
	cfg := transport.DefaultConfig()
	cfg.URL = b.url
	cfg.TLS = transport.TLSConfig{CAFile: b.pki.CA, CertFile: b.pki.ClientCert, KeyFile: b.pki.ClientKey}
	cfg.User = user
	cfg.PasswordFile = filepath.Join(b.dir, "client-"+user+".pw")
	if err := os.WriteFile(cfg.PasswordFile, []byte("pw-"+user+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Metrics, _ = transport.NewConnMetrics(nil)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// party is one connected user.
type party struct {
	cfg transport.Config
	nc  *nats.Conn
	js  jetstream.JetStream
}

func (b *bus) connect(t *testing.T, user string, adjust func(*transport.Config)) party {
	t.Helper()
	cfg := b.client(t, user)
	if adjust != nil {
		adjust(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := transport.Connect(ctx, cfg, user, b.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return party{cfg, nc, js}
}

func (p party) violations() float64 { return testutil.ToFloat64(p.cfg.Metrics.PermissionViolations) }

// growingSource is an inventory source whose cloud gains a port at the
// second read: the service then publishes a second version (a delta and
// a replaced snapshot).
type growingSource struct{ reads atomic.Int32 }

func (s *growingSource) Poll(context.Context) (*inventory.Inventory, bool, error) {
	if s.reads.Add(1) == 1 {
		return testInventory(4), true, nil
	}
	return testInventory(5), true, nil
}

func testInventory(ports int) *inventory.Inventory {
	inv := &inventory.Inventory{}
	for i := range ports {
		inv.Ports = append(inv.Ports, inventory.Port{ID: fmt.Sprintf("port-%d", i), NetworkID: "net", ProjectID: fmt.Sprintf("tenant-%d", i),
			MACAddress: fmt.Sprintf("fa:16:3e:00:00:%02x", i), DeviceOwner: "compute:nova"})
	}
	return inv
}

func flowMsg(t *testing.T, node string, seq int64, n int) *nats.Msg {
	t.Helper()
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: node, AgentID: node, BatchSeq: seq, RecordIndex: int32(i), TimeEnd: time.Now().UnixMicro(), Bytes: 100, Packets: 1}
	}
	enc, err := schemas.NewEncoder(transport.DefaultConfig().Codec)
	if err != nil {
		t.Fatal(err)
	}
	body, err := enc.Encode(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(transport.FlowsSubject(node))
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, node+"-"+strconv.FormatInt(seq, 10))
	return m
}

func runRoles(t *testing.T, b *bus, durable string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	metersDurable := durable + transport.MetersDurableSuffix

	// Collector: the streams and its durables, with its role's rights.
	col := b.connect(t, "collector", func(c *transport.Config) { c.Collector.Durable = durable })
	if err := transport.EnsureStreams(ctx, col.js, col.cfg, b.log); err != nil {
		t.Fatalf("collector cannot set up the streams with its role's permissions: %v", err)
	}
	// An operator pre-creates the analytics subscriber's durable, and a
	// consumer by hand that no configuration names.
	ops := b.connect(t, "ops", nil)
	for _, d := range []string{"analytics", "backup"} {
		if _, err := ops.js.CreateConsumer(ctx, transport.FlowsStream, jetstream.ConsumerConfig{
			Durable: d, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.FlowsSubjectRoot + ".>"}); err != nil {
			t.Fatal(err)
		}
	}

	// Inventory service: publishes a snapshot with its role's rights.
	inv := b.connect(t, "inventory", nil)
	svc, err := invserve.New(invserve.Config{Instance: "test", Lease: 5 * time.Second, PollInterval: 2 * time.Second},
		&growingSource{}, inv.js, b.log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(ctx)
	sdone := make(chan error, 1)
	go func() { sdone <- svc.Run(sctx) }()
	t.Cleanup(func() {
		scancel()
		if err := <-sdone; err != nil {
			t.Errorf("inventory serve: %v", err)
		}
	})

	// Agents with inventory.provider: nats and nats.manage_streams: false.
	no := false
	agents := map[string]party{}
	var providers []*natsinv.Provider
	for _, node := range []string{"cmp1", "cmp2"} {
		a := b.connect(t, "agent-"+node, func(c *transport.Config) { c.ManageStreams = &no })
		if err := transport.EnsureStreamsKeepConsumers(ctx, a.js, a.cfg, b.log); err != nil {
			t.Fatalf("agent-%s waiting for the streams: %v", node, err)
		}
		p, err := natsinv.NewProvider(a.nc, natsinv.Options{StatePath: filepath.Join(b.dir, node+".snapshot"), Logger: b.log})
		if err != nil {
			t.Fatal(err)
		}
		providers = append(providers, p)
		pctx, pcancel := context.WithCancel(ctx)
		pdone := make(chan error, 1)
		go func() { pdone <- p.Run(pctx) }()
		t.Cleanup(func() { pcancel(); <-pdone })
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		got, changed, err := p.Poll(wctx)
		wcancel()
		if err != nil || !changed || len(got.Ports) < 4 {
			t.Fatalf("agent-%s got no inventory snapshot (the issue 22/25 symptom): %v", node, err)
		}
		// A targeted lookup is answered on the agent's own inbox.
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = a.nc.RequestWithContext(rctx, roles.InventoryLookup, []byte("fa:16:3e:00:00:01"))
		rcancel()
		if err != nil {
			t.Fatalf("agent-%s: lookup not answered: %v", node, err)
		}
		if _, err := a.js.PublishMsg(ctx, flowMsg(t, node, 1, 5)); err != nil {
			t.Fatalf("agent-%s publishing its own batch: %v", node, err)
		}
		if v := a.violations(); v != 0 {
			t.Fatalf("agent-%s: %v permission violations doing its job", node, v)
		}
		agents[node] = a
	}

	// The service's second version (a delta, the snapshot replaced and
	// the old one's chunks purged) reaches both agents.
	for i, p := range providers {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			if c := p.Current(); c != nil && len(c.Inv.Ports) == 5 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent %d did not get the inventory's second version", i+1)
			}
		}
	}

	// Subscribers read. Ordered ones in their own slots: two readers of
	// tap at once (claiming concurrently: each gets a slot of its own,
	// both replay), and replay's reader, the victim of the attacks below
	// (idle through them: a long InactiveThreshold keeps its consumer).
	tap := b.connect(t, "tap", nil)
	readers := make([]*ordered.Reader, 2)
	opened := make(chan error, len(readers))
	for i := range readers {
		readers[i] = newReader(t, tap, "tap", 0)
		go func() { opened <- readers[i].Open(ctx) }()
	}
	for range readers {
		if err := <-opened; err != nil {
			t.Fatalf("tap: claiming a slot: %v", err)
		}
	}
	if n0, n1 := readers[0].Name(), readers[1].Name(); n0 == n1 || !strings.HasPrefix(n0, "tap-") || !strings.HasPrefix(n1, "tap-") {
		t.Fatalf("two tap readers in slots %q and %q, want two of tap's own", n0, n1)
	}
	for _, r := range readers {
		if got := readN(t, ctx, r, 2); got != 2 {
			t.Fatalf("tap reader in %s read %d of 2 batches", r.Name(), got)
		}
	}
	for _, r := range readers {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	rp := b.connect(t, "replay", nil)
	victim := newReader(t, rp, "replay", 10*time.Minute)
	if got := readN(t, ctx, victim, 1); got != 1 || victim.Name() != "replay-0" {
		t.Fatalf("replay: read %d in slot %q, want 1 in replay-0", got, victim.Name())
	}
	t.Cleanup(func() { _ = victim.Close() })
	slotReclaimed(t, ctx, b)

	// analytics creates its durable at start, as the example subscribers
	// do (here the operator's already exists: the same configuration).
	an := b.connect(t, "analytics", nil)
	ac, err := an.js.CreateOrUpdateConsumer(ctx, transport.FlowsStream, jetstream.ConsumerConfig{
		Durable: "analytics", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.FlowsSubjectRoot + ".>"})
	if err != nil {
		t.Fatalf("analytics: its durable: %v", err)
	}
	batch, err := ac.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("analytics: ack: %v", err)
		}
		read++
	}
	if read != 2 {
		t.Fatalf("analytics read %d of 2 batches (%v)", read, batch.Error())
	}

	for _, p := range []party{col, inv, tap, rp, an, ops} {
		if v := p.violations(); v != 0 {
			t.Fatalf("%s: %v permission violations doing its job", p.cfg.User, v)
		}
	}

	// The forbidden actions, each refused as a permission violation, and
	// the collector's and analytics' consumers unchanged afterwards.
	forbidden := []struct {
		name string
		who  party
		do   func(context.Context) error
	}{
		{"agent publishes as another agent", agents["cmp1"], func(c context.Context) error {
			_, err := agents["cmp1"].js.PublishMsg(c, flowMsg(t, "cmp2", 2, 5))
			return err
		}},
		{"agent publishes another agent's meters", agents["cmp1"], func(c context.Context) error {
			_, err := agents["cmp1"].js.Publish(c, transport.MetersSubject("cmp2"), []byte("x"))
			return err
		}},
		{"agent forges a dead letter", agents["cmp1"], func(c context.Context) error {
			_, err := agents["cmp1"].js.Publish(c, transport.DLQFlowsSubject, []byte("x"))
			return err
		}},
		{"agent reads another's records live", agents["cmp1"], func(c context.Context) error {
			sub, err := agents["cmp1"].nc.SubscribeSync(transport.FlowsSubject("cmp2"))
			if err != nil {
				return err
			}
			defer func() { _ = sub.Unsubscribe() }()
			return agents["cmp1"].nc.FlushWithContext(c) // the refusal is asynchronous: counted
		}},
		{"agent reads another's records from the stream", agents["cmp1"], func(c context.Context) error {
			_, err := agents["cmp1"].js.OrderedConsumer(c, transport.FlowsStream, jetstream.OrderedConsumerConfig{
				FilterSubjects: []string{transport.FlowsSubject("cmp2")}, DeliverPolicy: jetstream.DeliverAllPolicy})
			return err
		}},
		{"agent direct-gets another's records", agents["cmp1"], func(c context.Context) error {
			_, err := agents["cmp1"].nc.RequestWithContext(c, "$JS.API.DIRECT.GET."+transport.FlowsStream+"."+transport.FlowsSubject("cmp2"), nil)
			return err
		}},
		{"agent purges the flows stream", agents["cmp1"], func(c context.Context) error {
			st, err := agents["cmp1"].js.Stream(c, transport.FlowsStream)
			if err != nil {
				return err
			}
			return st.Purge(c)
		}},
		{"agent deletes the flows stream", agents["cmp1"], func(c context.Context) error {
			return agents["cmp1"].js.DeleteStream(c, transport.FlowsStream)
		}},
		{"agent updates the flows stream", agents["cmp1"], func(c context.Context) error {
			st, err := agents["cmp1"].js.Stream(c, transport.FlowsStream)
			if err != nil {
				return err
			}
			sc := st.CachedInfo().Config
			sc.MaxBytes = 1 << 20
			_, err = agents["cmp1"].js.UpdateStream(c, sc)
			return err
		}},
		{"agent replaces the inventory", agents["cmp1"], func(c context.Context) error {
			obs, err := agents["cmp1"].js.ObjectStore(c, roles.InventoryBucket)
			if err != nil {
				return err
			}
			_, err = obs.PutBytes(c, roles.InventoryObject, []byte("forged"))
			return err
		}},
		{"agent purges the inventory", agents["cmp1"], func(c context.Context) error {
			st, err := agents["cmp1"].js.Stream(c, roles.InventoryStream)
			if err != nil {
				return err
			}
			return st.Purge(c)
		}},
		{"agent sends an inventory delta", agents["cmp1"], func(c context.Context) error {
			return agents["cmp1"].nc.Publish(roles.InventoryDelta, []byte("forged"))
		}},
		{"subscriber updates the collector's durable", tap, func(c context.Context) error {
			_, err := tap.js.CreateOrUpdateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{
				Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.FlowsSubject("cmp1")})
			return err
		}},
		{"subscriber updates the collector's meters durable", tap, func(c context.Context) error {
			_, err := tap.js.CreateOrUpdateConsumer(c, transport.MetersStream, jetstream.ConsumerConfig{
				Durable: metersDurable, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.MetersSubject("cmp1")})
			return err
		}},
		{"subscriber updates the default-named durable", tap, func(c context.Context) error {
			_, err := tap.js.CreateOrUpdateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{
				Durable: transport.DefaultDurable, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.FlowsSubject("cmp1")})
			return err
		}},
		{"subscriber names the collector's durable in a nameless create", tap, func(c context.Context) error {
			_, err := tap.nc.RequestWithContext(c, "$JS.API.CONSUMER.CREATE."+transport.FlowsStream,
				[]byte(`{"stream_name":"`+transport.FlowsStream+`","config":{"name":"`+durable+`","ack_policy":"explicit","filter_subject":"tapflow.flows.v1.cmp1"}}`))
			return err
		}},
		{"subscriber deletes the collector's durable", tap, func(c context.Context) error {
			return tap.js.DeleteConsumer(c, transport.FlowsStream, durable)
		}},
		{"subscriber pulls from the collector's durable", tap, func(c context.Context) error {
			m := nats.NewMsg("$JS.API.CONSUMER.MSG.NEXT." + transport.FlowsStream + "." + durable)
			m.Data = []byte(`{"batch":1,"expires":1000000000}`)
			_, err := tap.nc.RequestMsgWithContext(c, m)
			return err
		}},
		{"subscriber acks for the collector", tap, func(c context.Context) error {
			return tap.nc.Publish("$JS.ACK."+transport.FlowsStream+"."+durable+".1.1.1.0.0", nil)
		}},
		{"subscriber updates another subscriber's durable", tap, func(c context.Context) error {
			_, err := tap.js.CreateOrUpdateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{
				Durable: "analytics", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.FlowsSubject("cmp1")})
			return err
		}},
		{"subscriber deletes another subscriber's durable", tap, func(c context.Context) error {
			return tap.js.DeleteConsumer(c, transport.FlowsStream, "analytics")
		}},
		{"subscriber pulls from another subscriber's durable", tap, func(c context.Context) error {
			m := nats.NewMsg("$JS.API.CONSUMER.MSG.NEXT." + transport.FlowsStream + ".analytics")
			m.Data = []byte(`{"batch":1,"expires":1000000000}`)
			_, err := tap.nc.RequestMsgWithContext(c, m)
			return err
		}},
		{"ordered subscriber deletes another ordered subscriber's consumer", tap, func(c context.Context) error {
			return tap.js.DeleteConsumer(c, transport.FlowsStream, victim.Name())
		}},
		{"ordered subscriber pulls from another ordered subscriber's consumer", tap, func(c context.Context) error {
			m := nats.NewMsg("$JS.API.CONSUMER.MSG.NEXT." + transport.FlowsStream + "." + victim.Name())
			m.Data = []byte(`{"batch":1,"expires":1000000000}`)
			_, err := tap.nc.RequestMsgWithContext(c, m)
			return err
		}},
		{"ordered subscriber updates another ordered subscriber's consumer", tap, func(c context.Context) error {
			_, err := tap.js.CreateOrUpdateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{Name: victim.Name(), AckPolicy: jetstream.AckNonePolicy,
				DeliverPolicy: jetstream.DeliverAllPolicy, FilterSubject: transport.FlowsSubject("nowhere"), MemoryStorage: true})
			return err
		}},
		{"ordered subscriber reads another ordered subscriber's consumer info", tap, func(c context.Context) error {
			_, err := tap.js.Consumer(c, transport.FlowsStream, victim.Name())
			return err
		}},
		{"ordered subscriber creates a consumer with a name of its choosing", tap, func(c context.Context) error {
			_, err := tap.js.CreateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{Name: "squat", AckPolicy: jetstream.AckNonePolicy})
			return err
		}},
		{"ordered subscriber creates a consumer beyond its slots", tap, func(c context.Context) error {
			_, err := tap.js.CreateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{
				Name: roles.OrderedNames("tap", roles.DefaultOrderedSlots+1)[roles.DefaultOrderedSlots], AckPolicy: jetstream.AckNonePolicy})
			return err
		}},
		{"ordered subscriber pulls from a consumer made by hand", tap, func(c context.Context) error {
			m := nats.NewMsg("$JS.API.CONSUMER.MSG.NEXT." + transport.FlowsStream + ".backup")
			m.Data = []byte(`{"batch":1,"expires":1000000000}`)
			_, err := tap.nc.RequestMsgWithContext(c, m)
			return err
		}},
		{"ordered subscriber deletes a consumer made by hand", tap, func(c context.Context) error {
			return tap.js.DeleteConsumer(c, transport.FlowsStream, "backup")
		}},
		{"durable subscriber deletes its durable", an, func(c context.Context) error {
			return an.js.DeleteConsumer(c, transport.FlowsStream, "analytics")
		}},
		{"durable subscriber updates the collector's durable", an, func(c context.Context) error {
			_, err := an.js.CreateOrUpdateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{
				Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: transport.FlowsSubject("cmp1")})
			return err
		}},
		{"durable subscriber deletes the collector's durable", an, func(c context.Context) error {
			return an.js.DeleteConsumer(c, transport.FlowsStream, durable)
		}},
		{"durable subscriber creates a consumer", an, func(c context.Context) error {
			_, err := an.js.CreateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{Durable: "hold-back", AckPolicy: jetstream.AckExplicitPolicy})
			return err
		}},
		{"subscriber publishes records", tap, func(c context.Context) error {
			_, err := tap.js.PublishMsg(c, flowMsg(t, "cmp1", 3, 1))
			return err
		}},
		{"collector publishes records", col, func(c context.Context) error {
			_, err := col.js.PublishMsg(c, flowMsg(t, "cmp1", 4, 1))
			return err
		}},
		{"collector replaces the inventory", col, func(c context.Context) error {
			return col.nc.Publish("$O."+roles.InventoryBucket+".M.x", []byte("forged"))
		}},
	}
	for _, f := range forbidden {
		t.Run(f.name, func(t *testing.T) {
			// A refused request gets no reply, only the server's
			// asynchronous permission error (counted): it is abandoned
			// once counted. A refusal still in flight from the action
			// before (an object put is refused twice) must not count
			// for this one: the counter settles first.
			before := f.who.violations()
			for settled := time.Now(); time.Since(settled) < 100*time.Millisecond; time.Sleep(10 * time.Millisecond) {
				if v := f.who.violations(); v != before {
					before, settled = v, time.Now()
				}
			}
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			defer ccancel()
			errc := make(chan error, 1)
			go func() { errc <- f.do(cctx) }()
			for f.who.violations() <= before && cctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			ccancel()
			err := <-errc
			if f.who.violations() <= before {
				t.Fatalf("%s: not refused as a permission violation (err %v)", f.who.cfg.User, err)
			}
		})
	}

	// Nothing forbidden took effect: the consumers keep their config and
	// the collector gets every genuine record (5 per agent), no forged one.
	for _, c := range []struct{ stream, name, filter string }{
		{transport.FlowsStream, durable, transport.FlowsSubjectRoot + ".>"},
		{transport.MetersStream, metersDurable, transport.MetersSubjectRoot + ".>"},
		{transport.FlowsStream, "analytics", transport.FlowsSubjectRoot + ".>"},
		{transport.FlowsStream, "backup", transport.FlowsSubjectRoot + ".>"},
		{transport.FlowsStream, victim.Name(), transport.FlowsSubjectRoot + ".>"},
	} {
		ci, err := ops.js.Consumer(ctx, c.stream, c.name)
		if err != nil {
			t.Fatalf("consumer %s on %s: %v", c.name, c.stream, err)
		}
		if f := ci.CachedInfo().Config.FilterSubject; f != c.filter {
			t.Errorf("consumer %s on %s: filter %q, want %q (changed by a subscriber)", c.name, c.stream, f, c.filter)
		}
	}
	for _, name := range []string{"squat", roles.OrderedNames("tap", roles.DefaultOrderedSlots+1)[roles.DefaultOrderedSlots]} {
		if _, err := ops.js.Consumer(ctx, transport.FlowsStream, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("consumer %s: %v, want not found (created by a subscriber)", name, err)
		}
	}
	// The victim's reader reads on undisturbed: its consumer was neither
	// deleted nor changed (a reset would have recreated it).
	if got := readN(t, ctx, victim, 1); got != 1 || victim.Resets() != 0 {
		t.Errorf("replay's reader after the attacks: read %d of 1, %d resets", got, victim.Resets())
	}
	ccfg := consume.DefaultConfig()
	ccfg.Durable = durable
	ccfg.AckWait = units.Duration(10 * time.Second)
	ccfg.AgentIDIsNode = true
	src, err := consume.New(col.js, ccfg, consume.Options{Logger: b.log, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	out := make(chan *pipeline.BatchOf[schemas.Flow], 4)
	done := make(chan error, 1)
	go func() { done <- src.Run(rctx, out) }()
	nodes := map[string]int{}
	for got := 0; got < 10; {
		select {
		case bt := <-out:
			for _, r := range bt.Records {
				nodes[r.Node]++
			}
			got += len(bt.Records)
			bt.Ack(nil) // committed
		case <-time.After(30 * time.Second):
			t.Fatalf("collector delivered %d of 10 records: %v", got, nodes)
		}
	}
	rcancel()
	go func() {
		for bt := range out {
			bt.Ack(nil)
		}
	}()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	close(out)
	if nodes["cmp1"] != 5 || nodes["cmp2"] != 5 {
		t.Errorf("collector got %v, want 5 records of each agent", nodes)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ci, err := ops.js.Consumer(ctx, transport.FlowsStream, durable)
		if err != nil {
			t.Fatal(err)
		}
		info, err := ci.Info(ctx)
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector's acks did not land: %+v %v", info, err)
		}
	}
	if v := inv.violations(); v != 0 {
		t.Errorf("inventory: %v permission violations doing its job", v)
	}
}

// newReader is an ordered reader of user on the flows stream from the
// start, in user's slots as the doc configures them.
func newReader(t *testing.T, p party, user string, inactive time.Duration) *ordered.Reader {
	t.Helper()
	slots := 0
	for _, u := range roles.Example().Users {
		if u.Name == user {
			slots = u.Slots
		}
	}
	r, err := ordered.New(p.js, ordered.Config{Stream: transport.FlowsStream, FilterSubject: transport.FlowsSubjectRoot + ".>", User: user, Slots: slots,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: inactive}, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readN reads n messages with r (within 30s) and returns how many came.
func readN(t *testing.T, ctx context.Context, r *ordered.Reader, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got := 0
	err := r.Run(ctx, func(jetstream.Msg) error {
		if got++; got == n {
			return ordered.ErrStop
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ordered reader %s: %v", r.Name(), err)
	}
	return got
}

// slotReclaimed: replay has two slots; with replay-0 held and a second
// reader in replay-1, a third finds none free at once; once the second's
// process dies (its connection closed, no Close), the server deletes its
// consumer after its InactiveThreshold and the third gets replay-1.
func slotReclaimed(t *testing.T, ctx context.Context, b *bus) {
	dying := b.connect(t, "replay", nil)
	second := newReader(t, dying, "replay", 2*time.Second)
	if err := second.Open(ctx); err != nil || second.Name() != "replay-1" {
		t.Fatalf("second replay reader: slot %q, %v; want replay-1", second.Name(), err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- second.Run(rctx, func(jetstream.Msg) error { return nil }) }() // pulling, as a live tap does
	third := newReader(t, b.connect(t, "replay", nil), "replay", 0)
	if err := third.Open(ctx); !errors.Is(err, ordered.ErrNoSlot) {
		t.Fatalf("third replay reader with both slots held: %v, want ErrNoSlot", err)
	}
	start := time.Now()
	dying.nc.Close()
	rcancel()
	<-rdone
	for deadline := start.Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		err := third.Open(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, ordered.ErrNoSlot) || time.Now().After(deadline) {
			t.Fatalf("the dead reader's slot was not freed within 2m: %v", err)
		}
	}
	t.Logf("a dead reader's slot free again %s after its connection closed (InactiveThreshold 2s)", time.Since(start).Round(100*time.Millisecond))
	if third.Name() != "replay-1" {
		t.Fatalf("third replay reader got %q, want the freed replay-1", third.Name())
	}
	if err := third.Close(); err != nil {
		t.Fatal(err)
	}
}
