package transport_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
)

// TestNATSConfigSnippet: the nats-server configuration in docs/security.md
// (generated from transport/roles) parses with nats-server's own parser
// and gives each user exactly the lists the embedded server applies
// (UserPermissions).
func TestNATSConfigSnippet(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- roles:begin nats-server.conf -->\n")
	if ok {
		_, rest, ok = strings.Cut(rest, "```\n")
	}
	if !ok {
		t.Fatal("docs/security.md: no <!-- roles:begin nats-server.conf --> block")
	}
	conf, _, _ := strings.Cut(rest, "```")
	dir := t.TempDir()
	p := transporttest.NewPKI(t, dir)
	conf = strings.NewReplacer(`"/etc/nats/server.pem"`, `"`+p.ServerCert+`"`, `"/etc/nats/server-key.pem"`, `"`+p.ServerKey+`"`,
		`"/etc/nats/ca.pem"`, `"`+p.CA+`"`, `"/var/lib/nats"`, `"`+filepath.Join(dir, "js")+`"`).Replace(conf)
	users := []transport.ServerUser{
		{User: "agent-cmp1", Role: transport.RoleAgent, Node: "cmp1"},
		{User: "agent-cmp2", Role: transport.RoleAgent, Node: "cmp2"},
		{User: "collector", Role: transport.RoleCollector},
		{User: "inventory", Role: transport.RoleInventory},
		{User: "analytics", Role: transport.RoleSubscriber, Durable: "analytics"},
		{User: "tap", Role: transport.RoleSubscriber, Ordered: true},
		{User: "replay", Role: transport.RoleSubscriber, Ordered: true, OrderedSlots: 2},
		{User: "ops", Role: transport.RoleAdmin},
	}
	for _, u := range users {
		v := strings.ToUpper(strings.ReplaceAll(u.User, "-", "_")) + "_PASSWORD"
		t.Setenv(v, "pw-"+v)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the snippet: %v", err)
	}
	roles := transport.UserPermissions(users, "")
	if len(opts.Users) != len(roles) {
		t.Fatalf("%d users in the snippet, want %d", len(opts.Users), len(roles))
	}
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	for _, u := range opts.Users {
		want, ok := roles[u.Username]
		if !ok {
			t.Errorf("unexpected user %s", u.Username)
			continue
		}
		if u.Password != "pw-"+strings.ToUpper(strings.ReplaceAll(u.Username, "-", "_"))+"_PASSWORD" {
			t.Errorf("%s: password not from its variable", u.Username)
		}
		got := u.Permissions
		if got == nil || got.Publish == nil || got.Subscribe == nil {
			t.Errorf("%s: no permissions", u.Username)
			continue
		}
		if !slices.Equal(sorted(got.Publish.Allow), sorted(want.Publish)) {
			t.Errorf("%s publish allow:\n doc  %q\n code %q", u.Username, sorted(got.Publish.Allow), sorted(want.Publish))
		}
		if len(got.Publish.Deny) > 0 {
			t.Errorf("%s: a publish deny list %q (rights are granted by name)", u.Username, got.Publish.Deny)
		}
		if (got.Response != nil) != want.AllowResponses {
			t.Errorf("%s allow_responses: doc %v, code %v", u.Username, got.Response != nil, want.AllowResponses)
		}
		if !slices.Equal(sorted(got.Subscribe.Allow), sorted(want.Subscribe)) {
			t.Errorf("%s subscribe allow:\n doc  %q\n code %q", u.Username, sorted(got.Subscribe.Allow), sorted(want.Subscribe))
		}
	}
	if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Error("the snippet does not require client certificates")
	}
}
