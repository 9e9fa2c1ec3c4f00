package transport_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
)

// TestValidateSecurity: every bad nats security setting is reported with
// the key and the fix; a secret file others can read is refused with the
// chmod that fixes it; a listener beyond loopback needs TLS and users.
func TestValidateSecurity(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // umask-independent
			t.Fatal(err)
		}
		return p
	}
	secret, open, groupRead := file("secret", 0o600), file("open", 0o644), file("group", 0o640)
	p := transporttest.NewPKI(t, dir)
	users := []transport.ServerUser{{User: "a", PasswordFile: secret, Role: transport.RoleAgent, Node: "n1"}}
	serverTLS := transport.ServerTLS{CertFile: p.ServerCert, KeyFile: p.ServerKey}
	cases := []struct {
		name string
		set  func(*transport.Config)
		want []string // "" = valid
	}{
		{"defaults", func(*transport.Config) {}, nil},
		{"loopback listen without auth", func(c *transport.Config) { c.Listen = "127.0.0.1:4222" }, nil},
		{"localhost listen", func(c *transport.Config) { c.Listen = "localhost:4222" }, nil},
		{"user and password file", func(c *transport.Config) { c.URL, c.User, c.PasswordFile = "nats://h:4222", "agent", secret }, nil},
		{"group-readable secret", func(c *transport.Config) { c.URL, c.User, c.PasswordFile = "nats://h:4222", "agent", groupRead }, nil},
		{"world-readable password", func(c *transport.Config) { c.URL, c.User, c.PasswordFile = "nats://h:4222", "agent", open },
			[]string{"password_file", "readable by every user", "chmod 600 " + open}},
		{"world-readable token", func(c *transport.Config) { c.URL, c.TokenFile = "nats://h:4222", open }, []string{"token_file", "chmod 600"}},
		{"world-readable tls key", func(c *transport.Config) {
			c.URL, c.TLS = "nats://h:4222", transport.TLSConfig{CertFile: p.ClientCert, KeyFile: open}
		}, []string{"tls.key_file", "chmod 600"}},
		{"missing password file", func(c *transport.Config) { c.URL, c.User, c.PasswordFile = "nats://h:4222", "agent", dir+"/nope" },
			[]string{"password_file", "no such file"}},
		{"user without password", func(c *transport.Config) { c.URL, c.User = "nats://h:4222", "agent" }, []string{"password_file", transport.PasswordEnv}},
		{"password file without user", func(c *transport.Config) { c.URL, c.PasswordFile = "nats://h:4222", secret }, []string{"set nats.user"}},
		{"two auth methods", func(c *transport.Config) {
			c.URL, c.User, c.PasswordFile, c.TokenFile = "nats://h:4222", "agent", secret, secret
		},
			[]string{"token_file", "set together with nats.user", "one authentication method"}},
		{"auth key and password in url", func(c *transport.Config) { c.URL, c.TokenFile = "nats://u:pw@h:4222", secret },
			[]string{"remove the user, password or token from nats.url"}},
		{"cert without key", func(c *transport.Config) { c.URL, c.TLS.CertFile = "nats://h:4222", p.ClientCert }, []string{"cert_file and key_file"}},
		{"open listen, no security", func(c *transport.Config) { c.Listen = "0.0.0.0:4222" },
			[]string{"listen", "beyond loopback", "nats.server.tls.cert_file and key_file and nats.server.users"}},
		{"empty host listen", func(c *transport.Config) { c.Listen = ":4222" }, []string{"beyond loopback"}},
		{"open listen, TLS only", func(c *transport.Config) { c.Listen, c.Server.TLS = "0.0.0.0:4222", serverTLS },
			[]string{"without nats.server.users"}},
		{"open listen, users only", func(c *transport.Config) { c.Listen, c.Server.Users = "0.0.0.0:4222", users },
			[]string{"without nats.server.tls.cert_file and key_file"}},
		{"open listen, TLS and users", func(c *transport.Config) { c.Listen, c.Server.TLS, c.Server.Users = "0.0.0.0:4222", serverTLS, users }, nil},
		{"server without listen", func(c *transport.Config) { c.Server.Users = users }, []string{"set nats.listen"}},
		{"agent user without node", func(c *transport.Config) {
			c.Listen, c.Server.Users = "127.0.0.1:0", []transport.ServerUser{{User: "a", PasswordFile: secret, Role: "agent"}}
		}, []string{"server.users[0].node"}},
		{"unknown role", func(c *transport.Config) {
			c.Listen, c.Server.Users = "127.0.0.1:0", []transport.ServerUser{{User: "a", PasswordFile: secret, Role: "root"}}
		}, []string{"server.users[0].role"}},
		{"subscriber on the collector's custom durable", func(c *transport.Config) {
			c.Listen, c.Collector.Durable = "127.0.0.1:0", "billing"
			c.Server.Users = []transport.ServerUser{{User: "s", PasswordFile: secret, Role: "subscriber", Durable: "billing"}}
		}, []string{"server.users[0]", `"billing" is both collector.durable's flows durable and subscriber s's durable`, "give each user consumer names of its own"}},
		{"subscriber on the default collector's meters durable", func(c *transport.Config) {
			c.Listen = "127.0.0.1:0"
			c.Server.Users = []transport.ServerUser{{User: "s", PasswordFile: secret, Role: "subscriber", Durable: "tapflow-collector-meters"}}
		}, []string{"server.users[0]", `"tapflow-collector-meters" is both the default collector's meters durable and subscriber s's durable`}},
		{"ordered slot on another subscriber's durable", func(c *transport.Config) {
			c.Listen = "127.0.0.1:0"
			c.Server.Users = []transport.ServerUser{{User: "an", PasswordFile: secret, Role: "subscriber", Durable: "tap-2"},
				{User: "tap", PasswordFile: secret, Role: "subscriber", Ordered: true}}
		}, []string{"server.users[1]", `"tap-2" is both subscriber an's durable and ordered subscriber tap's slot`, "ordered slots are <user>-0, <user>-1"}},
		{"collector.durable on an ordered slot", func(c *transport.Config) {
			c.Listen, c.Collector.Durable = "127.0.0.1:0", "tap-0"
			c.Server.Users = []transport.ServerUser{{User: "tap", PasswordFile: secret, Role: "subscriber", Ordered: true, OrderedSlots: 1}}
		}, []string{"server.users[0]", `"tap-0" is both collector.durable's flows durable and ordered subscriber tap's slot`}},
		{"ordered_slots without ordered", func(c *transport.Config) {
			c.Listen = "127.0.0.1:0"
			c.Server.Users = []transport.ServerUser{{User: "s", PasswordFile: secret, Role: "subscriber", OrderedSlots: 2}}
		}, []string{"server.users[0].ordered_slots", "only with ordered: true"}},
		{"too many ordered_slots", func(c *transport.Config) {
			c.Listen = "127.0.0.1:0"
			c.Server.Users = []transport.ServerUser{{User: "s", PasswordFile: secret, Role: "subscriber", Ordered: true, OrderedSlots: 65}}
		}, []string{"server.users[0].ordered_slots", "1..64"}},
		{"user with password and nkey", func(c *transport.Config) {
			c.Listen, c.Server.Users = "127.0.0.1:0", []transport.ServerUser{{User: "a", PasswordFile: secret, Nkey: "UABC", Role: "admin"}}
		}, []string{"exactly one of password_file and nkey"}},
		{"world-readable server password", func(c *transport.Config) {
			c.Listen, c.Server.Users = "127.0.0.1:0", []transport.ServerUser{{User: "a", PasswordFile: open, Role: "admin"}}
		}, []string{"server.users[0].password_file", "chmod 600"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := transport.DefaultConfig()
			c.set(&cfg)
			err := cfg.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
	t.Run("NewEmbeddedServer refuses an open listen", func(t *testing.T) {
		_, err := transport.NewEmbeddedServer(t.TempDir(), "x", transport.Config{Listen: "0.0.0.0:0"}, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), "nats.server.users") {
			t.Fatalf("err = %v", err)
		}
		if _, err := transport.NewEmbedded(t.TempDir(), "0.0.0.0:0", "x", slog.New(slog.DiscardHandler)); err == nil {
			t.Fatal("NewEmbedded accepted 0.0.0.0 without TLS and users")
		}
	})
}
