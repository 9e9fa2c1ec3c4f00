package transport_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestConnectBackground: with nothing listening, ConnectBackground returns
// a connection at once, a JetStream publish on it fails fast (no client
// buffer: the agent spools instead of waiting publish_timeout per batch),
// and once a server appears on the address the connection comes up by
// itself and publishes succeed.
func TestConnectBackground(t *testing.T) {
	addr := freeAddr(t)
	cfg := transport.DefaultConfig()
	cfg.URL = "nats://" + addr
	var logs logBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	start := time.Now()
	nc, err := transport.ConnectBackground(cfg, "agent", log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("ConnectBackground blocked %s with NATS down", d)
	}
	if !strings.Contains(logs.String(), "NATS unreachable at start") {
		t.Errorf("no outage line in the log:\n%s", logs.String())
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start = time.Now()
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("n"), Data: []byte("x")})
	if err == nil {
		t.Fatal("publish succeeded with no server")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("publish on a not yet connected conn took %s (err %v): it must fail fast", d, err)
	}
	t.Logf("publish while down failed after %s: %v", time.Since(start), err)

	srv, err := transport.NewEmbedded(t.TempDir(), addr, "late", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for deadline := time.Now().Add(20 * time.Second); !nc.IsConnected(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("connection did not come up after the server started")
		}
	}
	if err := transport.EnsureStreams(ctx, js, cfg, log); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("n"), Data: []byte("x")}); err != nil {
		t.Fatalf("publish once connected: %v", err)
	}
	if !strings.Contains(logs.String(), "connected to NATS") {
		t.Errorf("no connected line in the log:\n%s", logs.String())
	}
}

// TestValidateURL: a nats.url that cannot work is a validation error that
// names the key and never shows the password, not an endless retry.
func TestValidateURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		ok   bool
		want string // in the error
	}{
		{"nats://a:4222", true, ""},
		{"nats://a:4222, tls://b:4222,ws://c:8080,wss://d", true, ""},
		{"a:4222", true, ""},
		{"user:pw@a:4222", true, ""},
		{"nats://user:pw@a", true, ""},
		{"http://a:4222", false, `scheme "http"`},
		{"nats://a:42x22", false, "does not parse"},
		{"nats://a:70000", false, "not 1-65535"},
		{"nats://:4222", false, "no host"},
		{"nats://a:4222,", false, "empty entry"},
		{"nats://a:4222/path", false, "unexpected path"},
		{"nats://user:hunter2@a:99999", false, "not 1-65535"},
		{"user:hunter2@a:bad", false, "does not parse"},
		{"nats://us er:hunter2@a:4222 x", false, ""},
	} {
		cfg := transport.DefaultConfig()
		cfg.URL = tc.url
		err := cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("url %q: err %v, want ok=%v", tc.url, err, tc.ok)
			continue
		}
		if err == nil {
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "url") || !strings.Contains(msg, tc.want) {
			t.Errorf("url %q: error %q does not name the key and %q", tc.url, msg, tc.want)
		}
		if strings.Contains(msg, "hunter2") {
			t.Errorf("url %q: error shows the password: %s", tc.url, msg)
		}
	}
}

// TestWrongCredentials: a server with user/password refuses a wrong
// password. Connect (the collector) and ConnectBackground (the agent)
// report an authorization failure with the fix at once — also when the
// server only appears after the agent started — never "unreachable;
// retrying" forever, and the password appears in no error and no log.
func TestWrongCredentials(t *testing.T) {
	const secret = "wr0ng-pa55word"
	startServer := func(t *testing.T, port int) string {
		t.Helper()
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true,
			Username: "tapflow", Password: "right-password"})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		t.Cleanup(srv.Shutdown)
		return srv.Addr().String()
	}
	check := func(t *testing.T, err error, logs string) {
		t.Helper()
		if !errors.Is(err, transport.ErrAuth) {
			t.Fatalf("error %v is not an authorization failure", err)
		}
		for _, want := range []string{"Authorization Violation", "refused the credentials", "nats.url"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(logs, secret) {
			t.Errorf("password leaked:\nerr: %v\nlogs: %s", err, logs)
		}
		if strings.Contains(logs, "unreachable") {
			t.Errorf("wrong credentials logged as unreachable:\n%s", logs)
		}
	}
	for _, form := range []string{"nats://tapflow:%s@%s", "tapflow:%s@%s"} {
		t.Run("connect "+strings.SplitN(form, ":", 2)[0], func(t *testing.T) {
			addr := startServer(t, -1)
			cfg := transport.DefaultConfig()
			cfg.URL = fmt.Sprintf(form, secret, addr)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			var logs logBuf
			log := slog.New(slog.NewTextHandler(&logs, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := transport.Connect(ctx, cfg, "collector", log)
			if ctx.Err() != nil {
				t.Fatalf("Connect retried until the deadline: %v", err)
			}
			check(t, err, logs.String())
			start := time.Now()
			_, err = transport.ConnectBackground(cfg, "agent", log, nil)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("ConnectBackground took %s", d)
			}
			check(t, err, logs.String())
			t.Logf("%v", err)
		})
	}
	t.Run("server appears after the agent started", func(t *testing.T) {
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		cfg := transport.DefaultConfig()
		cfg.URL = "nats://tapflow:" + secret + "@" + addr
		var logs logBuf
		log := slog.New(slog.NewTextHandler(&logs, nil))
		fatal := make(chan error, 1)
		nc, err := transport.ConnectBackground(cfg, "agent", log, func(err error) { fatal <- err })
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		p, _ := strconv.Atoi(port)
		startServer(t, p)
		select {
		case err := <-fatal:
			check(t, err, strings.ReplaceAll(logs.String(), "unreachable at start", "")) // that line was true then
		case <-time.After(30 * time.Second):
			t.Fatalf("no authorization failure reported 30 s after the server appeared; logs:\n%s", logs.String())
		}
	})
}

// TestRedact: every URL form nats.go accepts loses its user information
// (password, or a token standing alone) and keeps its hosts.
func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"nats://user:hunter2@a:4222", "nats://REDACTED@a:4222"},
		{"user:hunter2@a:4222", "REDACTED@a:4222"},
		{"hunter2@a:4222", "REDACTED@a:4222"},
		{"nats://hunter2@a", "nats://REDACTED@a"},
		{"tls://u:hunter2@a:4222,nats://v:hunter2@b:4222", "tls://REDACTED@a:4222,nats://REDACTED@b:4222"},
		{"nats://a:4222, u:hunter2@b:4222", "nats://a:4222,REDACTED@b:4222"},
		{"nats://u:hun@ter2hunter2@a:4222", "nats://REDACTED@a:4222"},
		{"nats://u:hunter2@a:bad port", "nats://REDACTED@a:bad port"},
		{"wss://u:hunter2@[::1]:443", "wss://REDACTED@[::1]:443"},
		{"ws://hunter2@h:8080", "ws://REDACTED@h:8080"},
		{"u:hunter2@[::1]:4222", "REDACTED@[::1]:4222"},
		{"nats://a:4222", "nats://a:4222"},
		{"a", "a"},
	} {
		r := transport.Redact(c.in)
		if strings.Contains(r, "hunter2") || strings.Contains(r, "ter2") {
			t.Errorf("redact(%q) = %q: password kept", c.in, r)
		}
		if r != c.want {
			t.Errorf("redact(%q) = %q, want %q", c.in, r, c.want)
		}
	}
}

// TestConnectedURLHidesToken: nats.go's ConnectedUrlRedacted keeps a token
// (nats://token@host); the "connected to NATS" line must not.
func TestConnectedURLHidesToken(t *testing.T) {
	const token = "t0ken-hunter2"
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, Authorization: token})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	defer srv.Shutdown()
	for _, url := range []string{"nats://" + token + "@" + srv.Addr().String(), token + "@" + srv.Addr().String()} {
		cfg := transport.DefaultConfig()
		cfg.URL = url
		var logs logBuf
		nc, err := transport.ConnectBackground(cfg, "agent", slog.New(slog.NewTextHandler(&logs, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
		if !strings.Contains(logs.String(), "connected to NATS") || strings.Contains(logs.String(), token) {
			t.Fatalf("log:\n%s", logs.String())
		}
	}
}
