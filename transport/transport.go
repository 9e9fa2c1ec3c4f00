// Package transport holds tapflow's NATS plumbing shared by the agent and the
// collector: the embedded nats-server with JetStream (the default
// deployment), client connections that survive outages, and the stream
// definitions (TAPFLOW_FLOWS, TAPFLOW_METERS, TAPFLOW_DLQ) created
// idempotently.
package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/fsx"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport/names"
)

// Subjects and stream names: the transport contract (DESIGN §5).
const (
	FlowsStream       = names.FlowsStream
	FlowsSubjectRoot  = names.FlowsSubjectRoot
	MetersStream      = names.MetersStream
	MetersSubjectRoot = names.MetersSubjectRoot
	DLQStream         = names.DLQStream
	DLQSubjectRoot    = names.DLQSubjectRoot
	DLQFlowsSubject   = DLQSubjectRoot + ".flows"  // + ".<sender>": DLQSubject
	DLQMetersSubject  = DLQSubjectRoot + ".meters" // + ".<sender>": DLQSubject
	// DLQEvictedRoot + ".<flows|meters>.<sender>" holds one tally per
	// sender of the dead letters evicted to keep it within
	// collector.dlq_letters_per_node: DLQEvictedSubject.
	DLQEvictedRoot    = DLQSubjectRoot + ".evicted"
	HeaderOrigSubject = "Tapflow-Original-Subject"
	HeaderOrigSeq     = "Tapflow-Original-Sequence"
	HeaderError       = "Tapflow-Error"
)

// MaxPayload is the embedded server's message size limit.
const MaxPayload = 8 << 20

// MetersMaxBytes is the default cap of TAPFLOW_METERS
// (nats.meters_stream_max_bytes). Meter records are two per tap every
// meter_interval (~100 B each on the wire): 1 GiB holds weeks of a large
// node's meters when no collector consumes them.
const MetersMaxBytes = 1 << 30

// FlowsSubject is the subject an agent on node publishes flows to.
func FlowsSubject(node string) string { return FlowsSubjectRoot + "." + node }

// MetersSubject is the subject an agent on node publishes meters to.
func MetersSubject(node string) string { return MetersSubjectRoot + "." + node }

// DLQSender is who sent a message on subject, for dead-letter
// accounting: the token after the flows or meters root, which per-node
// publish permissions bind to one agent (FlowsSubject). A subject outside
// both roots is "_other".
func DLQSender(subject string) string {
	for _, root := range []string{FlowsSubjectRoot, MetersSubjectRoot} {
		if rest, ok := strings.CutPrefix(subject, root+"."); ok {
			if i := strings.IndexByte(rest, '.'); i >= 0 {
				rest = rest[:i]
			}
			if rest != "" {
				return rest
			}
		}
	}
	return "_other"
}

// DLQSubject is the subject the collector dead-letters a message received
// on origSubject to: dlqPrefix (DLQFlowsSubject or DLQMetersSubject) and
// the sender, so each sender's letters can be counted and bounded apart
// from the others' (one agent's garbage cannot evict another's letters).
// Older collectors used dlqPrefix alone; those letters stay readable.
func DLQSubject(dlqPrefix, origSubject string) string {
	return dlqPrefix + "." + DLQSender(origSubject)
}

// DLQEvictedSubject holds the eviction tally of sender's letters under
// dlqPrefix (DLQFlowsSubject or DLQMetersSubject).
func DLQEvictedSubject(dlqPrefix, sender string) string {
	return DLQEvictedRoot + "." + strings.TrimPrefix(dlqPrefix, DLQSubjectRoot+".") + "." + sender
}

// DLQMaxBytes is the default cap of TAPFLOW_DLQ (nats.dlq_max_bytes).
const DLQMaxBytes = 1 << 30

// Config is the `nats:` section.
type Config struct {
	// URL of an external NATS server or cluster (comma-separated). Empty:
	// `tapflow run` embeds a nats-server with JetStream in <data_dir>/nats.
	URL string `yaml:"url"`
	// Listen is the embedded server's client address (e.g. 127.0.0.1:4222)
	// so other agents and collectors can connect. Empty (default): the
	// embedded server is reachable only in-process.
	Listen string `yaml:"listen"`
	// Codec is the message body format: lz4 (default: Arrow IPC with
	// Arrow's own LZ4_FRAME buffer compression, the least CPU on both
	// sides per record sent once NATS's per-byte cost is counted),
	// arrow-zstd (the same with zstd), zstd (the whole Arrow IPC stream
	// in one zstd frame: smallest), none (plain Arrow IPC);
	// schemas.Codecs, measurements in docs/subscribers.md.
	Codec string `yaml:"codec"`
	// StreamMaxBytes caps the backlog of TAPFLOW_FLOWS on disk (default
	// 10GiB): the batches not yet acked by every consumer (interest
	// retention; acked batches leave the stream). When full, publishes
	// are refused (agents retry and spool) rather than old data discarded.
	StreamMaxBytes units.ByteSize `yaml:"stream_max_bytes"`
	// MetersStreamMaxBytes caps the backlog of TAPFLOW_METERS (default 1GiB).
	MetersStreamMaxBytes units.ByteSize `yaml:"meters_stream_max_bytes"`
	// DLQMaxBytes caps TAPFLOW_DLQ (default 1GiB). When full, new dead
	// letters are refused (the message stays in its stream, retried)
	// rather than anyone's older letters discarded; one sender holds at
	// most collector.dlq_letters_per_node letters (docs/delivery.md).
	DLQMaxBytes units.ByteSize `yaml:"dlq_max_bytes"`
	// Replicas is how many copies of each stream (and of the durable
	// consumers, which inherit it) a NATS cluster keeps: 1, 3 or 5
	// (default 1). More than 1 needs a JetStream cluster of at least that
	// many servers; the embedded server is a single node.
	Replicas int `yaml:"replicas"`
	// DuplicateWindow is the JetStream dedupe window for Nats-Msg-Id (default 2m).
	DuplicateWindow units.Duration `yaml:"duplicate_window"`
	// PublishTimeout bounds one publish round trip (default 10s).
	PublishTimeout units.Duration `yaml:"publish_timeout"`
	// TLS is the client side of TLS to an external NATS (custom CA,
	// mutual TLS). docs/security.md.
	TLS TLSConfig `yaml:"tls"`
	// User authenticates with a password from PasswordFile (or the
	// TAPFLOW_NATS_PASSWORD environment variable). One of user,
	// token_file, nkey_seed_file, creds_file.
	User         string `yaml:"user"`
	PasswordFile string `yaml:"password_file"`
	// TokenFile holds an authentication token.
	TokenFile string `yaml:"token_file"`
	// NkeySeedFile holds a user nkey seed (SU...).
	NkeySeedFile string `yaml:"nkey_seed_file"`
	// CredsFile is a NATS credentials file (JWT + nkey seed).
	CredsFile string `yaml:"creds_file"`
	// InboxPrefix is where replies to this client arrive (default
	// _INBOX.<user> with nats.user, else _INBOX): least-privilege users
	// may subscribe only to their own replies.
	InboxPrefix string `yaml:"inbox_prefix"`
	// ManageStreams: create and update the streams and the collector's
	// consumers at start (nil: true). false: only wait until they exist
	// (an agent whose NATS user may not change streams).
	ManageStreams *bool `yaml:"manage_streams"`
	// Server secures the embedded server (nats.listen).
	Server ServerConfig `yaml:"server"`

	// Metrics counts connection events (permission violations); set by
	// the app, nil in tools.
	Metrics *ConnMetrics `yaml:"-"`

	// Collector is the collector's durable consumer, which EnsureStreams
	// creates with the streams (interest retention drops a message
	// published while no consumer exists). Not a key of its own: config
	// composition copies it from the `collector:` section, which agents
	// and collectors share in one file.
	Collector CollectorConsumer `yaml:"-"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Codec:                schemas.CodecLZ4,
		StreamMaxBytes:       10 << 30,
		MetersStreamMaxBytes: MetersMaxBytes,
		DLQMaxBytes:          DLQMaxBytes,
		Replicas:             1,
		DuplicateWindow:      units.Duration(2 * time.Minute),
		PublishTimeout:       units.Duration(10 * time.Second),
		Collector:            DefaultCollectorConsumer(),
	}
}

// Validate reports every bad field.
func (c Config) Validate() error {
	var e units.Errors
	if !schemas.ValidCodec(c.Codec) {
		e.Add("codec", fmt.Sprintf("%q: unknown codec", c.Codec), "use "+strings.Join(schemas.Codecs, ", "))
	}
	if c.StreamMaxBytes < 64<<20 {
		e.Add("stream_max_bytes", fmt.Sprintf("%s: too small", c.StreamMaxBytes), "use at least 64MiB, e.g. 10GiB")
	}
	if c.MetersStreamMaxBytes < 16<<20 {
		e.Add("meters_stream_max_bytes", fmt.Sprintf("%s: too small", c.MetersStreamMaxBytes), "use at least 16MiB, e.g. 1GiB")
	}
	if c.DLQMaxBytes != 0 && c.DLQMaxBytes < 16<<20 {
		e.Add("dlq_max_bytes", fmt.Sprintf("%s: too small", c.DLQMaxBytes), "use at least 16MiB, e.g. 1GiB")
	}
	switch c.Replicas {
	case 1, 3, 5:
	default:
		e.Add("replicas", fmt.Sprintf("%d: not 1, 3 or 5", c.Replicas), "use 1 (single server), 3 or 5 (a JetStream cluster of at least that many servers)")
	}
	if c.Replicas > 1 && c.URL == "" {
		e.Add("replicas", fmt.Sprintf("%d with the embedded server", c.Replicas), "the embedded server is one node: set nats.url to a JetStream cluster, or use replicas: 1")
	}
	if c.DuplicateWindow.D() < time.Second {
		e.Add("duplicate_window", fmt.Sprintf("%s: too short", c.DuplicateWindow), "use e.g. 2m")
	}
	if c.PublishTimeout.D() < 100*time.Millisecond {
		e.Add("publish_timeout", fmt.Sprintf("%s: too short", c.PublishTimeout), "use e.g. 10s")
	}
	if c.URL != "" {
		for _, p := range checkURLs(c.URL) {
			e.Add("url", p, "use nats://[user:password@]host:4222 (or tls://, ws://, wss://), comma-separated for a cluster")
		}
	}
	if c.URL != "" && c.Listen != "" {
		e.Add("listen", "set together with url", "listen only applies to the embedded server; clear one of them")
	}
	c.validateClientSecurity(&e)
	c.validateServer(&e)
	return e.Err()
}

// Embedded is an in-process nats-server with JetStream.
type Embedded struct {
	srv        *server.Server
	log        *slog.Logger
	internalPW string // in-process password when the server has users
}

// NewEmbedded prepares (but does not start) a server storing in storeDir.
// listen "" keeps it in-process only. It has no TLS and no users: a
// loopback listen only (NewEmbeddedServer secures the listener).
func NewEmbedded(storeDir, listen, name string, log *slog.Logger) (*Embedded, error) {
	return NewEmbeddedServer(storeDir, name, Config{Listen: listen}, log)
}

// NewEmbeddedServer prepares (but does not start) a server storing in
// storeDir, listening on cfg.Listen ("" keeps it in-process only) with
// cfg.Server's TLS and users. It refuses a listener beyond loopback
// without TLS and users.
func NewEmbeddedServer(storeDir, name string, cfg Config, log *slog.Logger) (*Embedded, error) {
	listen := cfg.Listen
	var e units.Errors
	cfg.validateServer(&e)
	if err := e.Err(); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if err := fsx.MkdirAll(storeDir, fsx.PrivateDir, fsx.NoGroup); err != nil {
		return nil, fmt.Errorf("embedded nats: create store %s: %w", storeDir, err)
	}
	opts := &server.Options{
		ServerName: name,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
		DontListen: listen == "",
		Port:       -1,
		Host:       "127.0.0.1",
		// Agent batches are ~40–80 B/record compressed: 8 MiB holds
		// 100K+ records. Larger batches are split by the publisher.
		MaxPayload: MaxPayload,
	}
	if listen != "" {
		h, p, err := splitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen %q: %w", listen, err)
		}
		if p == 0 {
			// nats-server reads port 0 as its default 4222: a second
			// server (parallel tests, another process) would then fail to
			// listen and never become ready. 0 means any free port here.
			p = server.RANDOM_PORT
		}
		opts.Host, opts.Port = h, p
	}
	pw, err := applyServerSecurity(opts, cfg.Server, cfg.Collector.Durable)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv.SetLoggerV2(&slogAdapter{log.With("component", "nats-server")}, false, false, false)
	return &Embedded{srv: srv, log: log, internalPW: pw}, nil
}

// Start starts the server and waits until it accepts connections.
func (e *Embedded) Start() error {
	go e.srv.Start()
	if !e.srv.ReadyForConnections(30 * time.Second) {
		return errors.New("embedded nats: not ready after 30s; see the nats-server log lines above")
	}
	e.log.Info("embedded nats-server ready", "store", e.srv.StoreDir(), "client_url", e.ClientURL())
	return nil
}

// ClientURL is the TCP URL when listening, else "".
func (e *Embedded) ClientURL() string {
	if e.srv.Addr() == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// Connect opens an in-process client connection.
func (e *Embedded) Connect(name string, log *slog.Logger) (*nats.Conn, error) {
	opts := append(clientOptions(Config{}, name, log), nats.InProcessServer(e.srv))
	if e.internalPW != "" {
		opts = append(opts, nats.UserInfo(internalUser, e.internalPW))
	}
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect embedded nats: %w", err)
	}
	return nc, nil
}

// Close shuts the server down and waits for it (JetStream flushes to disk).
func (e *Embedded) Close() error {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	return nil
}

// Connect dials an external NATS, retrying with backoff (1s → 30s) until
// it answers or ctx ends, and logging what it waits for (the collector:
// it has nothing to do without NATS). Credentials the server refuses fail
// at once (ErrAuth), never "unreachable; retrying". The returned
// connection reconnects forever.
func Connect(ctx context.Context, cfg Config, name string, log *slog.Logger) (*nats.Conn, error) {
	sec, err := securityOptions(cfg)
	if err != nil {
		return nil, err
	}
	opts := append(clientOptions(cfg, name, log), sec...)
	delay := time.Second
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(cfg.URL, withinDeadline(ctx, opts)...)
		if err == nil {
			if verr := checkServerVersion(nc); verr != nil {
				nc.Close()
				return nil, verr
			}
			log.Info("connected to NATS", "url", connectedURL(nc), "server_version", nc.ConnectedServerVersion(), "attempts", attempt)
			return nc, nil
		}
		if isAuthError(err) {
			return nil, authError(cfg, err)
		}
		if isTLSError(err) {
			return nil, tlsError(cfg, err)
		}
		log.Warn("NATS unreachable; retrying (nothing to consume until it answers)", "url", redact(cfg.URL), "attempt", attempt, "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect nats %s: %w (last error: %v)", redact(cfg.URL), ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 30*time.Second)
	}
}

// withinDeadline shortens nats.go's per-attempt timeout (2s: the dial,
// then the server's INFO and PONG) to what is left of ctx, so a server
// that accepts TCP and never answers cannot keep Connect past its
// deadline.
func withinDeadline(ctx context.Context, opts []nats.Option) []nats.Option {
	dl, ok := ctx.Deadline()
	if !ok {
		return opts
	}
	left := time.Until(dl)
	if left >= nats.DefaultTimeout {
		return opts
	}
	return append(slices.Clip(opts), nats.Timeout(max(left, 50*time.Millisecond)))
}

// ConnectBackground returns a connection to an external NATS at once (the
// agent: capture must not wait for NATS). One synchronous attempt first —
// refused credentials fail here with ErrAuth; if NATS does not answer, the
// connection keeps dialing in the background (publishes fail fast until
// it is up: no client-side buffer) and logs when it connects. fatal is
// called once if the connection gives up for good later (the server
// refuses the credentials once it answers).
func ConnectBackground(cfg Config, name string, log *slog.Logger, fatal func(error)) (*nats.Conn, error) {
	sec, err := securityOptions(cfg)
	if err != nil {
		return nil, err
	}
	opts := append(clientOptions(cfg, name, log), sec...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err == nil {
		if verr := checkServerVersion(nc); verr != nil {
			nc.Close()
			return nil, verr
		}
		log.Info("connected to NATS", "url", connectedURL(nc), "server_version", nc.ConnectedServerVersion())
		return nc, nil
	}
	if isAuthError(err) {
		return nil, authError(cfg, err)
	}
	if isTLSError(err) {
		return nil, tlsError(cfg, err)
	}
	log.Warn("NATS unreachable at start; capture runs and batches go to the spool, connecting in the background",
		"url", redact(cfg.URL), "err", err)
	probeOpts := opts
	if fatal != nil {
		// Called once, whether the close handler or the probe finds out.
		var once sync.Once
		f := fatal
		fatal = func(err error) { once.Do(func() { f(err) }) }
	}
	opts = append(opts,
		nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(nc *nats.Conn) {
			if err := checkServerVersion(nc); err != nil {
				// Nothing is published to a server tapflow does not
				// support: the batches stay in the spool.
				log.Error("NATS server refused: too old", "err", err)
				go nc.Close() // not from within nats.go's callback
				if fatal != nil {
					fatal(err)
				}
				return
			}
			log.Info("connected to NATS", "url", connectedURL(nc), "server_version", nc.ConnectedServerVersion())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil && isAuthError(err) && fatal != nil {
				fatal(authError(cfg, err))
			}
		}))
	nc, err = nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", redact(cfg.URL), err)
	}
	if fatal != nil {
		go probeUntilConnected(nc, cfg, probeOpts, fatal)
	}
	return nc, nil
}

// probeUntilConnected dials once in a while until nc is connected: nats.go
// retries a TLS session the server refuses (no client certificate, an
// untrusted CA) silently forever, so a probe connection finds out and
// calls fatal, as for refused credentials.
func probeUntilConnected(nc *nats.Conn, cfg Config, opts []nats.Option, fatal func(error)) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for range t.C {
		if nc.IsConnected() || nc.IsClosed() {
			return
		}
		probe, err := nats.Connect(cfg.URL, opts...)
		switch {
		case err == nil:
			probe.Close() // reachable and accepted: nc connects by itself
		case isTLSError(err):
			fatal(tlsError(cfg, err))
			return
		case isAuthError(err):
			fatal(authError(cfg, err))
			return
		}
	}
}

// ErrAuth marks a server that answered and refused the credentials.
var ErrAuth = errors.New("NATS authorization failed")

func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

func authError(cfg Config, err error) error {
	return fmt.Errorf("connect nats %s as %s: %w (%v): the server refused the credentials; fix nats.user and nats.password_file (or %s), nats.token_file, nats.nkey_seed_file, nats.creds_file, or the user in nats.url",
		redact(cfg.URL), cfg.who(), ErrAuth, err, PasswordEnv)
}

func tlsError(cfg Config, err error) error {
	return fmt.Errorf("connect nats %s: TLS: %w; check nats.tls (ca_file must hold the CA that signed the server's certificate; the server may require cert_file and key_file)", redact(cfg.URL), err)
}

// isTLSError: a handshake or certificate failure, which retrying cannot fix.
func isTLSError(err error) bool {
	s := err.Error()
	return errors.Is(err, nats.ErrTLS) || errors.Is(err, nats.ErrSecureConnRequired) || errors.Is(err, nats.ErrSecureConnWanted) ||
		strings.Contains(s, "x509:") || strings.Contains(s, "tls:")
}

// connectedURL is the server URL nc uses, without user information (nats.go's
// ConnectedUrlRedacted keeps a token: nats://token@host).
func connectedURL(nc *nats.Conn) string { return redact(nc.ConnectedUrl()) }

func clientOptions(cfg Config, name string, log *slog.Logger) []nats.Option {
	m, who := cfg.Metrics, cfg.who()
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectBufSize(-1), // never buffer publishes client-side: the agent retries itself
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS connection lost; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			if err := checkServerVersion(nc); err != nil {
				// A cluster node older than the rest: said loudly, not
				// fatal (the cluster may be mid-upgrade).
				log.Error("NATS reconnected to a server older than tapflow supports", "err", err, "fix", "upgrade every node of the NATS cluster to "+MinServerVersion+" or later")
				return
			}
			log.Info("NATS reconnected", "url", connectedURL(nc))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if isAuthError(err) {
				log.Error("NATS refused the credentials", "as", who, "err", err, "fix", "fix nats.user and nats.password_file, token_file, nkey_seed_file, creds_file or the user in nats.url")
				return
			}
			if errors.Is(err, nats.ErrPermissionViolation) {
				// The server drops the message; a JetStream publish then
				// times out and the publisher retries or spools it.
				m.permissionViolation()
				log.Error("NATS refused a publish or subscribe: permission violation; the batch is kept (retried, spooled) but cannot be delivered until the permissions are fixed",
					"as", who, "err", err, "fix", "allow this user the subject in the server's permissions (docs/security.md); an agent publishes on tapflow.flows.v1.<node> and tapflow.meters.v1.<node> of its own node")
				return
			}
			log.Warn("NATS async error", "err", err)
		}),
	}
}

// StreamConfigs are the streams tapflow needs, as cfg sizes them.
//
// TAPFLOW_FLOWS and TAPFLOW_METERS use interest retention: a message
// leaves the stream once every consumer on it has acked it, so MaxBytes
// bounds the backlog (what the collectors have not committed yet), not the
// total ever published. DiscardNew refuses a publish into a full backlog
// (the agent retries and spools) instead of silently dropping old batches.
// Not work-queue retention: it allows only one consumer per subject, which
// would lock out other subscribers (SubscriberConsumer). TAPFLOW_DLQ keeps
// limits retention: dead letters stay 14 days whether read or not. Its
// DiscardNew means a full DLQ refuses a new letter (the collector nacks
// the message, which stays in its stream) instead of evicting the oldest
// letter, whoever sent it; each sender's share is bounded by the
// collector (collector.dlq_letters_per_node on its own subject,
// DLQSubject), not by the stream.
func StreamConfigs(cfg Config) []jetstream.StreamConfig {
	replicas := max(cfg.Replicas, 1)
	metersMax := int64(cfg.MetersStreamMaxBytes)
	if metersMax == 0 {
		metersMax = MetersMaxBytes
	}
	dlqMax := int64(cfg.DLQMaxBytes)
	if dlqMax == 0 {
		dlqMax = DLQMaxBytes
	}
	return []jetstream.StreamConfig{{
		Name:        FlowsStream,
		Description: "tapflow flow.v1 record batches (Arrow IPC), one message per agent batch",
		Subjects:    []string{FlowsSubjectRoot + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.InterestPolicy,
		Discard:     jetstream.DiscardNew, // refuse, never silently drop old batches
		MaxBytes:    int64(cfg.StreamMaxBytes),
		Duplicates:  cfg.DuplicateWindow.D(),
		Replicas:    replicas,
	}, {
		Name:        MetersStream,
		Description: "tapflow meter.v1 record batches (Arrow IPC), one message per agent meter batch",
		Subjects:    []string{MetersSubjectRoot + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.InterestPolicy,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    metersMax,
		Duplicates:  cfg.DuplicateWindow.D(),
		Replicas:    replicas,
	}, {
		Name:        DLQStream,
		Description: "tapflow messages the collector refused (decode, size, identity, time), whole, with the reason in headers",
		Subjects:    []string{DLQSubjectRoot + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew, // no sender's letter is evicted by another's
		MaxAge:      14 * 24 * time.Hour,
		MaxBytes:    dlqMax,
		Replicas:    replicas,
	}}
}

// EnsureStreams creates or updates TAPFLOW_FLOWS, TAPFLOW_METERS and
// TAPFLOW_DLQ, and the collector's durable consumers on the first two
// (cfg.Collector), before any agent publishes: with interest retention a
// message published while no consumer exists is dropped at once
// (ensureStream: a new stream gets its subjects only after its consumer).
// A stream an older tapflow created with limits retention is migrated to
// interest in place where the server can (2.10+), recreated on 2.9 when
// every message in it is acked (logged). It is idempotent and retries with
// backoff while JetStream is unavailable; a configuration the server can
// never accept (replicas beyond the cluster's size, a work-queue stream, a
// limits stream with unacked messages on 2.9) fails at once with the fix.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) error {
	return ensureStreams(ctx, js, cfg, true, log)
}

// EnsureStreamsKeepConsumers is EnsureStreams for an agent: it creates
// the streams and the collector's durable consumers only when they are
// missing and never updates them. An agent's config need not carry the
// collectors' settings (its collector section is defaults), and updating
// would reset the collectors' ack_wait and max_ack_pending, and one
// agent's nats section the replicas and max_bytes of every stream, at
// every agent start. The one change it makes to an existing stream is to
// give a stream left detached by an interrupted creation its subjects,
// with the settings it was created with. A stream an older tapflow
// created with limits retention is left as it is: the collector migrates
// it (the agent's publishes land in it meanwhile).
func EnsureStreamsKeepConsumers(ctx context.Context, js jetstream.JetStream, cfg Config, log *slog.Logger) error {
	return ensureStreams(ctx, js, cfg, false, log)
}

// ensureStreams: admin (a collector, tapflow run) brings streams and
// consumers to cfg; otherwise (an agent) only what is missing is created.
func ensureStreams(ctx context.Context, js jetstream.JetStream, cfg Config, admin bool, log *slog.Logger) error {
	if cfg.ManageStreams != nil && !*cfg.ManageStreams {
		return waitStreams(ctx, js, log)
	}
	streams := StreamConfigs(cfg)
	consumers := CollectorConsumerConfigs(cfg.Collector)
	delay := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var err error
		for _, sc := range streams {
			if err = ensureStream(ctx, js, sc, consumers[sc.Name], admin, log); err != nil {
				break
			}
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, errPermanent) {
			return err
		}
		log.Warn("JetStream not ready; retrying", "attempt", attempt, "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %v)", err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 30*time.Second)
	}
}

// waitStreams waits until TAPFLOW_FLOWS and TAPFLOW_METERS exist
// (nats.manage_streams: false: a least-privilege agent that may only read
// stream info; the collector creates them).
func waitStreams(ctx context.Context, js jetstream.JetStream, log *slog.Logger) error {
	delay := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var err error
		for _, name := range []string{FlowsStream, MetersStream} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var st jetstream.Stream
			st, err = js.Stream(cctx, name)
			cancel()
			if err != nil {
				err = fmt.Errorf("stream %s: %w", name, err)
				break
			}
			if subj := st.CachedInfo().Config.Subjects; len(subj) == 1 && strings.HasSuffix(subj[0], "~setup") {
				err = fmt.Errorf("stream %s: being created (its consumers first)", name)
				break
			}
		}
		if err == nil {
			return nil
		}
		log.Warn("waiting for the JetStream streams (nats.manage_streams is false: a collector or an admin creates them)", "attempt", attempt, "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %v)", err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 30*time.Second)
	}
}

// afterCreate, when set (tests), runs right after ensureStream created a
// stream, before its consumer exists.
var afterCreate func(stream string)

// errPermanent marks stream errors that retrying cannot fix.
var errPermanent = errors.New("permanent")

// setupSubject is the one subject an interest stream has between its
// creation and its consumers' (ensureStream): inside the stream's own
// subject space, so the consumers' filters are valid on every server, and
// a token no agent publishes on (node names are [A-Za-z0-9_-]).
func setupSubject(sc jetstream.StreamConfig) string {
	return strings.TrimSuffix(sc.Subjects[0], ">") + "~setup"
}

// detached is sc with only its setup subject: no agent's publish can land
// in it, so none is dropped while it has no consumer.
func detached(sc jetstream.StreamConfig) jetstream.StreamConfig {
	sc.Subjects = []string{setupSubject(sc)}
	return sc
}

// ensureStream brings the stream to sc with consumer cc (when not nil) in
// place before any agent's publish can land in it: an interest stream
// drops at once a message no consumer wants. A new interest stream is
// created detached (only its setup subject), its consumer added, and only
// then given its subjects; whoever gives it its subjects (an agent, a
// collector, concurrently) has made sure of the consumer first, and
// tapflow never deletes that consumer. This works on every supported
// nats-server: 2.9 cannot change a stream's retention in place, 2.10 and
// later can. A stream an older tapflow created with limits retention is
// switched to interest in place where the server allows it (logged); on
// a 2.9 server it is recreated when deleting it loses nothing, else the
// error says what to do (legacyLimits). Without admin an existing stream
// and consumer keep their settings (attach).
func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig, cc *jetstream.ConsumerConfig, admin bool, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var old *jetstream.StreamInfo
	st, err := js.Stream(cctx, sc.Name)
	switch {
	case err == nil:
		old = st.CachedInfo()
	case errors.Is(err, jetstream.ErrStreamNotFound):
		first := sc
		if sc.Retention == jetstream.InterestPolicy {
			first = detached(sc)
		}
		if _, err := js.CreateStream(cctx, first); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return streamError(sc, err)
		}
		if afterCreate != nil {
			afterCreate(sc.Name)
		}
	default:
		return fmt.Errorf("stream %s: %w", sc.Name, err)
	}
	if old != nil && old.Config.Retention == jetstream.WorkQueuePolicy && sc.Retention != jetstream.WorkQueuePolicy {
		return fmt.Errorf("stream %s has work-queue retention (%d messages, %d bytes), tapflow needs %s: %w; NATS cannot change retention to or from work queue in place, and work queue allows only one consumer per subject. "+
			"Stop the agents, let whatever consumes the stream empty it (or back it up: nats stream backup %s <dir>), then run: nats stream rm -f %s; tapflow creates it again at the next start",
			sc.Name, old.State.Msgs, old.State.Bytes, sc.Retention, errPermanent, sc.Name, sc.Name)
	}
	if cc != nil {
		if err := ensureConsumer(cctx, js, sc.Name, *cc, admin); err != nil {
			return err
		}
	}
	if !admin {
		return attach(cctx, js, sc)
	}
	upd, err := js.UpdateStream(cctx, sc)
	if err != nil && old != nil && old.Config.Retention != sc.Retention && retentionChangeRefused(err) {
		if err := legacyLimits(cctx, js, old, sc, log); err != nil {
			return err
		}
		// Deleted: created again, detached first, as on an empty server.
		return ensureStream(ctx, js, sc, cc, admin, log)
	}
	if err != nil {
		return streamError(sc, err)
	}
	if info := upd.CachedInfo(); old != nil && old.Config.Retention != sc.Retention {
		log.Warn("stream retention migrated: messages every consumer has already acked are removed, the rest stay until acked; max_bytes now bounds the backlog, not the total published",
			"stream", sc.Name, "old", old.Config.Retention.String(), "new", sc.Retention.String(),
			"messages_before", old.State.Msgs, "messages_after", info.State.Msgs, "bytes_after", info.State.Bytes)
	}
	return nil
}

// attach gives a stream that has only its setup subject (created
// detached, by this process a moment ago or by one interrupted before its
// consumer was in place) its subjects, keeping every other setting it was
// created with; a stream with its subjects is left alone. The caller has
// made sure of the consumer.
func attach(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) error {
	st, err := js.Stream(ctx, sc.Name)
	if err != nil {
		return fmt.Errorf("stream %s: %w", sc.Name, err)
	}
	cur := st.CachedInfo().Config
	if len(cur.Subjects) != 1 || cur.Subjects[0] != setupSubject(sc) {
		return nil
	}
	cur.Subjects = sc.Subjects
	if _, err := js.UpdateStream(ctx, cur); err != nil {
		return streamError(sc, err)
	}
	return nil
}

// ensureConsumer creates consumer cc on stream, or brings an existing one
// to cc when update is set. Without update an existing consumer, whatever
// its settings, is the collectors' and is left alone: it is looked up
// first, because a 2.9 server treats a create of an existing durable as
// an update.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cc jetstream.ConsumerConfig, update bool) error {
	if update {
		if _, err := js.CreateOrUpdateConsumer(ctx, stream, cc); err != nil {
			return fmt.Errorf("create or update consumer %s on %s: %w", cc.Durable, stream, err)
		}
		return nil
	}
	_, err := js.Consumer(ctx, stream, cc.Durable)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("consumer %s on %s: %w", cc.Durable, stream, err)
	}
	if _, err := js.CreateConsumer(ctx, stream, cc); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		return fmt.Errorf("create consumer %s on %s: %w", cc.Durable, stream, err)
	}
	return nil
}

// retentionChangeRefused: the server cannot change a stream's retention
// in place (nats-server 2.9: "stream configuration update can not change
// retention policy", err_code 10052).
func retentionChangeRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10052 && strings.Contains(apiErr.Description, "retention")
}

// legacyLimits handles a stream an older tapflow created with limits
// retention on a server that cannot switch it to interest in place
// (2.9). With limits retention acked messages stay, so the stream can be
// recreated without loss only when every consumer on it has acked every
// message: then it is detached (no publish lands in it any more), checked
// again, deleted and created anew as ensureStream does. Otherwise the
// error names the messages at stake and the ways out. nil: deleted, to
// be created again.
func legacyLimits(ctx context.Context, js jetstream.JetStream, old *jetstream.StreamInfo, sc jetstream.StreamConfig, log *slog.Logger) error {
	st, err := js.Stream(ctx, sc.Name)
	if err != nil {
		return fmt.Errorf("stream %s: %w", sc.Name, err)
	}
	pending, err := unacked(ctx, st)
	if err != nil {
		return err
	}
	if pending > 0 {
		return fmt.Errorf("stream %s has %s retention (an older tapflow created it so) and holds %d messages (%d bytes), %d of them not yet acked by every consumer; tapflow needs interest retention and this nats-server (%s) cannot change a stream's retention in place: %w. "+
			"Either upgrade nats-server to 2.10 or later (tapflow then migrates the stream in place at its next start, nothing lost), "+
			"or keep 2.9 and recreate the stream: stop the agents, back it up if you need its messages (nats stream backup %s <dir>), run nats stream rm -f %s and start tapflow again (the unacked messages are gone)",
			sc.Name, strings.ToLower(old.Config.Retention.String()), old.State.Msgs, old.State.Bytes, pending, js.Conn().ConnectedServerVersion(), errPermanent, sc.Name, sc.Name)
	}
	// Detach first: from here no publish lands in it, so the check below
	// is final.
	orig := st.CachedInfo().Config
	cfg := orig
	cfg.Subjects = []string{setupSubject(sc)}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("detach stream %s before recreating it: %w", sc.Name, err)
	}
	if pending, err = unacked(ctx, st); err != nil || pending > 0 {
		// Something landed between the checks: give it its subjects back
		// and decide again at the next attempt.
		_, uerr := js.UpdateStream(ctx, orig)
		return errors.Join(fmt.Errorf("stream %s: %d messages arrived while it was being recreated; retrying", sc.Name, pending), err, uerr)
	}
	if err := js.DeleteStream(ctx, sc.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		_, uerr := js.UpdateStream(ctx, orig) // attached again: agents deliver meanwhile
		return errors.Join(fmt.Errorf("delete stream %s (every message acked) to recreate it with interest retention: %w; this NATS user needs $JS.API.STREAM.DELETE.%s once, or run nats stream rm -f %s", sc.Name, err, sc.Name, sc.Name), uerr)
	}
	log.Warn("stream recreated with interest retention: it had limits retention (an older tapflow) and every message in it was acked by every consumer; this nats-server cannot change retention in place",
		"stream", sc.Name, "messages_removed", old.State.Msgs, "server_version", js.Conn().ConnectedServerVersion())
	return nil
}

// unacked is how many messages of st some consumer has not acked yet
// (all of them when it has no consumer).
func unacked(ctx context.Context, st jetstream.Stream) (uint64, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", st.CachedInfo().Config.Name, err)
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	var worst uint64
	n := 0
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		n++
		// Everything after the ack floor is either pending or unacked.
		if ci.AckFloor.Stream < info.State.LastSeq {
			worst = max(worst, info.State.LastSeq-max(ci.AckFloor.Stream, info.State.FirstSeq-1))
		}
	}
	if err := lister.Err(); err != nil {
		return 0, fmt.Errorf("stream %s: list consumers: %w", info.Config.Name, err)
	}
	if n == 0 {
		return info.State.Msgs, nil
	}
	return worst, nil
}

// streamError wraps a create or update error with the fix when the server
// can never accept sc.
func streamError(sc jetstream.StreamConfig, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10074: // replicas > 1 not supported in non-clustered mode
			return fmt.Errorf("create or update stream %s with %d replicas: %w: %w; the server is not a JetStream cluster: set nats.replicas: 1, or point nats.url at a cluster of at least %d servers",
				sc.Name, sc.Replicas, errPermanent, err, sc.Replicas)
		case 10005, 10023: // no suitable peers / insufficient resources
			// Retried: a node may be restarting. If it persists the
			// cluster is too small for nats.replicas.
			return fmt.Errorf("create or update stream %s with %d replicas: %w; if this persists the cluster has fewer than %d JetStream servers up with room: lower nats.replicas or add servers",
				sc.Name, sc.Replicas, err, sc.Replicas)
		}
	}
	return fmt.Errorf("create or update stream %s: %w", sc.Name, err)
}

// StoreDir returns the embedded server's store directory under dataDir.
func StoreDir(dataDir string) string { return filepath.Join(dataDir, "nats") }
