package transport_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/ordered"
)

func randomSecret(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "s3cr3t-" + hex.EncodeToString(b)
}

func writeSecret(t *testing.T, dir, name, secret string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// secureBus is an embedded nats-server with mutual TLS and the role users
// of docs/security.md, listening on loopback.
type secureBus struct {
	url     string
	pki     transporttest.PKI
	dir     string
	secrets map[string]string // user -> password
	logs    *logBuf
	log     *slog.Logger
}

func startSecureBus(t *testing.T) *secureBus { return startSecureBusOn(t, "127.0.0.1:0", "") }

// startSecureBusOn starts the bus on listen, with the PKI and passwords in
// dir ("": a new temporary directory).
func startSecureBusOn(t *testing.T, listen, dir string) *secureBus {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	b := &secureBus{pki: transporttest.NewPKI(t, dir), dir: dir, secrets: map[string]string{}, logs: &logBuf{}}
	b.log = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	users := []transport.ServerUser{
		{User: "agent-a", Role: transport.RoleAgent, Node: "node-a"},
		{User: "agent-b", Role: transport.RoleAgent, Node: "node-b"},
		{User: "collector", Role: transport.RoleCollector},
		{User: "reader", Role: transport.RoleSubscriber},
		{User: "replayer", Role: transport.RoleSubscriber, Ordered: true},
		{User: "admin", Role: transport.RoleAdmin},
	}
	for i := range users {
		b.secrets[users[i].User] = randomSecret(t)
		users[i].PasswordFile = writeSecret(t, dir, "server-"+users[i].User+".pw", b.secrets[users[i].User])
	}
	cfg := transport.DefaultConfig()
	cfg.Listen = listen
	cfg.Server = transport.ServerConfig{
		TLS:   transport.ServerTLS{CertFile: b.pki.ServerCert, KeyFile: b.pki.ServerKey, CAFile: b.pki.CA},
		Users: users,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := transport.NewEmbeddedServer(filepath.Join(dir, "store"), "secure", cfg, b.log)
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

// client is the nats: section of user with mutual TLS against the bus.
func (b *secureBus) client(t *testing.T, user string) transport.Config {
	t.Helper()
	cfg := transport.DefaultConfig()
	cfg.URL = b.url
	cfg.TLS = transport.TLSConfig{CAFile: b.pki.CA, CertFile: b.pki.ClientCert, KeyFile: b.pki.ClientKey}
	cfg.User = user
	cfg.PasswordFile = writeSecret(t, b.dir, "client-"+user+".pw", b.secrets[user])
	cfg.Metrics, _ = transport.NewConnMetrics(nil)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (b *secureBus) connect(t *testing.T, cfg transport.Config) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := transport.Connect(ctx, cfg, cfg.User, b.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// flowMsg is one encoded batch of n records claiming node and agent, with
// the Nats-Msg-Id the collector expects of them.
func flowMsg(t *testing.T, subject, node, agent string, seq int64, n int) *nats.Msg {
	t.Helper()
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: node, AgentID: agent, BatchSeq: seq, RecordIndex: int32(i), TimeEnd: time.Now().UnixMicro(), Bytes: 100, Packets: 1}
	}
	enc, err := schemas.NewEncoder(transport.DefaultConfig().Codec)
	if err != nil {
		t.Fatal(err)
	}
	body, err := enc.Encode(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(subject)
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, agent+"-"+strconv.FormatInt(seq, 10))
	return m
}

// waitCounter polls c until it reaches want (async server errors).
func waitCounter(t *testing.T, c prometheus.Counter, want float64, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for testutil.ToFloat64(c) < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := testutil.ToFloat64(c); got < want {
		t.Fatalf("%s: tapflow_nats_permission_violations_total = %v, want ≥ %v", what, got, want)
	}
}

// TestSecureBus is the security matrix of docs/security.md against a real
// nats-server with mutual TLS and per-role users: what each role may do
// works, what it may not is refused by the server and surfaces as an
// error log line and tapflow_nats_permission_violations_total, and no
// password ever reaches a log or an error.
func TestSecureBus(t *testing.T) {
	b := startSecureBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The collector creates the streams and its durables with its role's
	// permissions only.
	colCfg := b.client(t, "collector")
	_, colJS := b.connect(t, colCfg)
	if err := transport.EnsureStreams(ctx, colJS, colCfg, b.log); err != nil {
		t.Fatalf("collector cannot set up the streams with its role's permissions: %v", err)
	}

	// Agent A may not change streams: it only waits until they exist.
	aCfg := b.client(t, "agent-a")
	no := false
	aCfg.ManageStreams = &no
	aNC, aJS := b.connect(t, aCfg)
	if err := transport.EnsureStreams(ctx, aJS, aCfg, b.log); err != nil {
		t.Fatalf("agent-a: %v", err)
	}
	if !strings.HasPrefix(aNC.NewRespInbox(), "_INBOX.agent-a.") {
		t.Fatalf("agent-a's inbox %q is not its own _INBOX.agent-a.*", aNC.NewRespInbox())
	}

	// A live reader (core subscription, read-only) sees agent A's batches.
	rCfg := b.client(t, "reader")
	rNC, _ := b.connect(t, rCfg)
	live, err := rNC.SubscribeSync(transport.FlowsSubjectRoot + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := rNC.Flush(); err != nil {
		t.Fatal(err)
	}

	// Allowed: agent A on its own node's subject.
	if _, err := aJS.PublishMsg(ctx, flowMsg(t, transport.FlowsSubject("node-a"), "node-a", "node-a", 1, 5)); err != nil {
		t.Fatalf("agent-a publishing on its own subject: %v", err)
	}
	if m, err := live.NextMsg(10 * time.Second); err != nil || m.Subject != transport.FlowsSubject("node-a") {
		t.Fatalf("reader did not see agent-a's batch: %v", err)
	}

	refusedPublish := func(t *testing.T, js jetstream.JetStream, cfg transport.Config, msg *nats.Msg) {
		t.Helper()
		before := testutil.ToFloat64(cfg.Metrics.PermissionViolations)
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := js.PublishMsg(pctx, msg)
		pcancel()
		if err == nil {
			t.Fatalf("%s published on %s: the server accepted it", cfg.User, msg.Subject)
		}
		waitCounter(t, cfg.Metrics.PermissionViolations, before+1, cfg.User+" on "+msg.Subject)
		t.Logf("refused: %s publishing on %s (publish error: %v)", cfg.User, msg.Subject, err)
	}
	matrix := []struct {
		name string
		js   jetstream.JetStream
		cfg  transport.Config
		msg  *nats.Msg
	}{
		{"agent on another node's flows", aJS, aCfg, flowMsg(t, transport.FlowsSubject("node-b"), "node-b", "node-b", 7, 5)},
		{"agent on another node's meters", aJS, aCfg, nats.NewMsg(transport.MetersSubject("node-b"))},
		{"agent forging a dead letter", aJS, aCfg, nats.NewMsg(transport.DLQFlowsSubject)},
		{"collector publishing flows", colJS, colCfg, flowMsg(t, transport.FlowsSubject("node-a"), "node-a", "node-a", 8, 5)},
	}
	rJS, _ := jetstream.New(rNC)
	matrix = append(matrix, struct {
		name string
		js   jetstream.JetStream
		cfg  transport.Config
		msg  *nats.Msg
	}{"subscriber publishing flows", rJS, rCfg, flowMsg(t, transport.FlowsSubject("node-a"), "node-a", "node-a", 9, 5)})
	for _, c := range matrix {
		t.Run(c.name, func(t *testing.T) { refusedPublish(t, c.js, c.cfg, c.msg) })
	}
	if !strings.Contains(b.logs.String(), "permission violation") || !strings.Contains(b.logs.String(), `user \"agent-a\"`) {
		t.Errorf("no permission violation error naming the user in the log:\n%s", b.logs.String())
	}

	// Refused: agent A reading other nodes' traffic, or the collector's
	// durable (its replies would arrive on the collector's inbox anyway).
	t.Run("agent reading flows", func(t *testing.T) {
		before := testutil.ToFloat64(aCfg.Metrics.PermissionViolations)
		if _, err := aNC.SubscribeSync(transport.FlowsSubjectRoot + ".>"); err != nil {
			t.Fatal(err)
		}
		_ = aNC.Flush()
		waitCounter(t, aCfg.Metrics.PermissionViolations, before+1, "agent-a subscribing to every node's flows")
	})
	t.Run("agent fetching from the collector's durable", func(t *testing.T) {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		if _, err := aJS.Consumer(cctx, transport.FlowsStream, transport.DefaultDurable); err == nil {
			t.Fatal("agent-a read the collector's consumer")
		}
	})
	// A subscriber without a durable has live core subscriptions only: it
	// can neither create a consumer (a durable nobody acks would hold the
	// interest streams' backlog) nor touch the collector's.
	refusedAPI := func(t *testing.T, what string, f func(context.Context) error) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		if err := f(cctx); err == nil {
			t.Fatalf("%s: allowed", what)
		}
		t.Logf("refused: %s", what)
	}
	t.Run("subscriber creating a durable", func(t *testing.T) {
		refusedAPI(t, "reader creates a durable", func(c context.Context) error {
			_, err := rJS.CreateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{Durable: "hold-back", AckPolicy: jetstream.AckExplicitPolicy})
			return err
		})
	})
	t.Run("subscriber deleting the collector's durable", func(t *testing.T) {
		refusedAPI(t, "reader deletes tapflow-collector", func(c context.Context) error {
			return rJS.DeleteConsumer(c, transport.FlowsStream, transport.DefaultDurable)
		})
	})
	pCfg := b.client(t, "replayer")
	pNC, pJS := b.connect(t, pCfg)
	t.Run("ordered subscriber replays from the start", func(t *testing.T) {
		// In its own slot (replayer-0 …): the only names its role allows.
		rd, err := ordered.New(pJS, ordered.Config{Stream: transport.FlowsStream, FilterSubject: transport.FlowsSubject("node-a"),
			User: "replayer", DeliverPolicy: jetstream.DeliverAllPolicy}, b.log)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rd.Close() }()
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		var subject string
		err = rd.Run(rctx, func(m jetstream.Msg) error { subject = m.Subject(); return ordered.ErrStop })
		if err != nil || subject == "" {
			t.Fatalf("ordered consumer %s: %v", rd.Name(), err)
		}
		if subject != transport.FlowsSubject("node-a") {
			t.Fatalf("got %s", subject)
		}
	})
	t.Run("ordered subscriber updating the collector's durable", func(t *testing.T) {
		refusedAPI(t, "replayer updates tapflow-collector", func(c context.Context) error {
			_, err := pJS.CreateOrUpdateConsumer(c, transport.FlowsStream, jetstream.ConsumerConfig{Durable: transport.DefaultDurable, AckPolicy: jetstream.AckNonePolicy})
			return err
		})
		refusedAPI(t, "replayer deletes tapflow-collector", func(c context.Context) error {
			return pJS.DeleteConsumer(c, transport.FlowsStream, transport.DefaultDurable)
		})
		refusedAPI(t, "replayer pulls from tapflow-collector", func(c context.Context) error {
			// A raw pull request under the collector's durable name.
			msg := nats.NewMsg("$JS.API.CONSUMER.MSG.NEXT." + transport.FlowsStream + "." + transport.DefaultDurable)
			msg.Data = []byte(`{"batch":1,"expires":1000000000}`)
			_, err := pNC.RequestMsgWithContext(c, msg)
			return err
		})
	})

	// Nothing agent A tried on node B's subject reached the stream.
	st, err := colJS.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(transport.FlowsSubject("node-b")))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[transport.FlowsSubject("node-b")]; n != 0 {
		t.Fatalf("%d forged messages on node-b's subject are in the stream", n)
	}

	// Forged identity: agent A publishes on its own subject (allowed)
	// records claiming node B. The collector dead-letters it (identity)
	// and delivers the genuine batches around it.
	t.Run("collector rejects records of another node", func(t *testing.T) {
		forged := []*nats.Msg{
			flowMsg(t, transport.FlowsSubject("node-a"), "node-b", "node-b", 42, 3), // records of node B
			flowMsg(t, transport.FlowsSubject("node-a"), "node-a", "node-b", 43, 3), // agent B's batch id
		}
		wantErr := []string{`has node "node-b", the subject`, `agent_id "node-b", not the subject's node "node-a"`}
		for _, m := range forged {
			if _, err := aJS.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := aJS.PublishMsg(ctx, flowMsg(t, transport.FlowsSubject("node-a"), "node-a", "node-a", 2, 4)); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		ccfg := consume.DefaultConfig()
		ccfg.AckWait = units.Duration(10 * time.Second)
		ccfg.AgentIDIsNode = true
		src, err := consume.New(colJS, ccfg, consume.Options{Logger: b.log, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		out := make(chan *pipeline.BatchOf[schemas.Flow], 4)
		done := make(chan error, 1)
		go func() { done <- src.Run(rctx, out) }()
		got := 0
		for got < 5+4 {
			select {
			case bt := <-out:
				for _, r := range bt.Records {
					if r.Node != "node-a" {
						t.Errorf("collector delivered a record of %q from node-a's subject", r.Node)
					}
				}
				got += len(bt.Records)
				bt.Ack(nil)
			case <-time.After(30 * time.Second):
				t.Fatalf("collector delivered %d of 9 genuine records", got)
			}
		}
		// An admin reads the DLQ: the collector may only write it.
		_, adminJS := b.connect(t, b.client(t, "admin"))
		dlq, err := adminJS.Stream(ctx, transport.DLQStream)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if info, err := dlq.Info(ctx); err == nil && info.State.Msgs >= uint64(len(forged)) {
				break
			}
		}
		for seq := uint64(1); seq <= uint64(len(forged)); seq++ {
			dl, err := dlq.GetMsg(ctx, seq)
			if err != nil {
				t.Fatalf("forged batch %d not dead-lettered: %v", seq, err)
			}
			if r := dl.Header.Get(transport.HeaderReason); r != consume.ReasonIdentity {
				t.Fatalf("dead letter reason %q (%s), want identity", r, dl.Header.Get(transport.HeaderError))
			}
			if e := dl.Header.Get(transport.HeaderError); !strings.Contains(e, wantErr[seq-1]) {
				t.Errorf("dead letter %d: %q, want %q", seq, e, wantErr[seq-1])
			}
			if id := dl.Header.Get(transport.HeaderOrigMsgID); id != forged[seq-1].Header.Get(jetstream.MsgIDHeader) {
				t.Errorf("dead letter %d is %q, want %q", seq, id, forged[seq-1].Header.Get(jetstream.MsgIDHeader))
			}
			t.Logf("dead-lettered: %s", dl.Header.Get(transport.HeaderError))
		}
		rcancel()
		go func() {
			for bt := range out {
				bt.Ack(nil)
			}
		}()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		close(out)
	})

	// Secrets: no password of any user in any log line (client and
	// server) or error above.
	for user, secret := range b.secrets {
		if strings.Contains(b.logs.String(), secret) {
			t.Errorf("password of %s in the log", user)
		}
	}
}

// TestSecureBusRefusesBadClients: wrong password, no client certificate,
// an untrusted server certificate and plain TCP all fail fast (no retry
// loop) with an error naming the cause and the user, never the password.
func TestSecureBusRefusesBadClients(t *testing.T) {
	b := startSecureBus(t)
	cases := []struct {
		name   string
		mutate func(*transport.Config)
		auth   bool     // ErrAuth
		want   []string // in the error
	}{
		{"wrong password", func(c *transport.Config) {
			c.PasswordFile = writeSecret(t, b.dir, "wrong.pw", "wr0ng-"+b.secrets["agent-a"])
		}, true, []string{`user "agent-a"`, "refused the credentials", "nats.password_file"}},
		{"password of another user", func(c *transport.Config) {
			c.PasswordFile = writeSecret(t, b.dir, "b.pw", b.secrets["agent-b"])
		}, true, []string{`user "agent-a"`}},
		{"password from the environment, wrong", func(c *transport.Config) {
			c.PasswordFile = ""
			t.Setenv(transport.PasswordEnv, "env-"+b.secrets["agent-a"])
		}, true, []string{`user "agent-a"`}},
		{"no client certificate", func(c *transport.Config) { c.TLS.CertFile, c.TLS.KeyFile = "", "" }, false, []string{"TLS", "nats.tls"}},
		{"server certificate from another CA", func(c *transport.Config) { c.TLS.CAFile = b.pki.OtherCA }, false, []string{"TLS", "ca_file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := b.client(t, "agent-a")
			c.mutate(&cfg)
			var logs logBuf
			log := slog.New(slog.NewTextHandler(&logs, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			_, err := transport.Connect(ctx, cfg, "agent-a", log)
			if err == nil {
				t.Fatal("connected")
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %s: retried instead of failing fast (%v)", d, err)
			}
			if c.auth != errors.Is(err, transport.ErrAuth) {
				t.Errorf("errors.Is(ErrAuth) = %v, want %v: %v", !c.auth, c.auth, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			_, bgErr := transport.ConnectBackground(cfg, "agent-a", log, nil)
			if bgErr == nil || c.auth != errors.Is(bgErr, transport.ErrAuth) {
				t.Errorf("ConnectBackground: %v", bgErr)
			}
			for _, s := range b.secrets {
				for _, text := range []string{err.Error(), logs.String(), b.logs.String()} {
					if strings.Contains(text, s) || strings.Contains(text, "wr0ng-") || strings.Contains(text, "env-s3cr3t") {
						t.Fatalf("a password leaked:\n%s", text)
					}
				}
			}
			t.Logf("%v", err)
		})
	}
	t.Run("TLS refused, server appears after the agent started", func(t *testing.T) {
		// The agent's first attempt finds nothing; once the server
		// answers, the refused TLS session stops the agent (fatal), never
		// an endless silent retry.
		dir := t.TempDir()
		addr := freeAddr(t)
		early := transporttest.NewPKI(t, dir) // the bus below rewrites the same files
		cfg := transport.DefaultConfig()
		cfg.URL = "tls://" + addr
		cfg.TLS = transport.TLSConfig{CAFile: early.CA}
		fatal := make(chan error, 1)
		nc, err := transport.ConnectBackground(cfg, "agent", slog.New(slog.DiscardHandler), func(err error) {
			select {
			case fatal <- err:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		startSecureBusOn(t, addr, dir)
		select {
		case err := <-fatal:
			if !strings.Contains(err.Error(), "TLS") || !strings.Contains(err.Error(), "nats.tls") {
				t.Fatalf("fatal: %v", err)
			}
			t.Logf("%v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no TLS failure reported 30 s after the server appeared")
		}
	})
	t.Run("plain TCP to the TLS listener", func(t *testing.T) {
		cfg := b.client(t, "agent-a")
		cfg.TLS = transport.TLSConfig{}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := transport.Connect(ctx, cfg, "agent-a", slog.New(slog.DiscardHandler)); err == nil || ctx.Err() != nil {
			t.Fatalf("plain connection: %v (deadline: %v)", err, ctx.Err())
		} else {
			t.Logf("%v", err)
		}
	})
}
