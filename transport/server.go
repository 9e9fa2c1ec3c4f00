package transport

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/transport/roles"
)

// ServerConfig is nats.server: TLS and users of the embedded server's
// listener (nats.listen). docs/security.md has the layout.
type ServerConfig struct {
	// TLS is the listener's certificate; with ca_file, clients must
	// present a certificate that chains to it (mutual TLS).
	TLS ServerTLS `yaml:"tls"`
	// Users may connect; each gets the permissions of its role.
	Users []ServerUser `yaml:"users"`
}

// ServerTLS is nats.server.tls.
type ServerTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
}

// ServerUser is one entry of nats.server.users.
type ServerUser struct {
	// User is the name (also its reply inbox: _INBOX.<user>).
	User string `yaml:"user"`
	// PasswordFile holds the password, in clear or as a bcrypt hash
	// ($2a$…, from `nats server passwd`): the hash is preferred.
	PasswordFile string `yaml:"password_file"`
	// Nkey is the user's public nkey (U…), instead of a password.
	Nkey string `yaml:"nkey"`
	// Role is agent, collector, inventory, subscriber or admin
	// (transport/roles).
	Role string `yaml:"role"`
	// Node is the node an agent publishes for (role agent).
	Node string `yaml:"node"`
	// Durable is the collector's durable consumer (default
	// tapflow-collector) or a subscriber's durable, which it may create
	// or update, read and ack (no other consumer).
	Durable string `yaml:"durable"`
	// Ordered lets a subscriber create its own ephemeral (ordered)
	// consumers, e.g. to replay from a point in time, under its slot
	// names <user>-0 … (roles.OrderedNames); without it and without
	// durable a subscriber only has live core subscriptions.
	Ordered bool `yaml:"ordered"`
	// OrderedSlots is how many ordered consumers it holds at once, one
	// per running tapflow tap (0: roles.DefaultOrderedSlots).
	OrderedSlots int `yaml:"ordered_slots"`
}

// Roles of nats.server.users (transport/roles has their permissions).
const (
	RoleAgent      = string(roles.Agent)
	RoleCollector  = string(roles.Collector)
	RoleInventory  = string(roles.Inventory)
	RoleSubscriber = string(roles.Subscriber)
	RoleAdmin      = string(roles.Admin)
)

// internalUser is the embedded server's own in-process client (this
// tapflow process); it cannot connect over the network.
const internalUser = "tapflow-internal"

// roleUser is u as transport/roles sees it.
func roleUser(u ServerUser) roles.User {
	return roles.User{Name: u.User, Role: roles.Role(u.Role), Node: u.Node, Durable: u.Durable, Ordered: u.Ordered, Slots: u.OrderedSlots}
}

// roleUsers are users as transport/roles sees them; collectorDurable is
// this process's collector.durable, the durable of collector users that
// name none.
func roleUsers(users []ServerUser, collectorDurable string) []roles.User {
	ru := make([]roles.User, len(users))
	for i, u := range users {
		ru[i] = roleUser(u)
		if u.Role == RoleCollector && u.Durable == "" {
			ru[i].Durable = collectorDurable
		}
	}
	return ru
}

// UserPermissions is what each of users may do on the embedded server
// (transport/roles), by user name; collectorDurable is this process's
// collector.durable (the durable of collector users that name none).
func UserPermissions(users []ServerUser, collectorDurable string) map[string]roles.Permissions {
	out := make(map[string]roles.Permissions, len(users))
	for _, u := range roleUsers(users, collectorDurable) {
		out[u.Name] = roles.For(u)
	}
	return out
}

// validateServer checks nats.listen and nats.server: nothing listens
// beyond loopback without TLS and users.
func (c Config) validateServer(e *units.Errors) {
	s := c.Server
	configured := s.TLS != (ServerTLS{}) || len(s.Users) > 0
	if configured && c.URL != "" {
		e.Add("server", "set together with url", "nats.server secures the embedded server; with an external nats.url configure that server instead")
	}
	if configured && c.Listen == "" && c.URL == "" {
		e.Add("server", "set without nats.listen", "the embedded server without listen is reachable only in-process: set nats.listen, or remove nats.server")
	}
	if c.Listen != "" && c.URL == "" && !loopbackListen(c.Listen) {
		var missing []string
		if s.TLS.CertFile == "" || s.TLS.KeyFile == "" {
			missing = append(missing, "nats.server.tls.cert_file and key_file")
		}
		if len(s.Users) == 0 {
			missing = append(missing, "nats.server.users")
		}
		if len(missing) > 0 {
			e.Add("listen", fmt.Sprintf("%q is reachable beyond loopback without %s", c.Listen, strings.Join(missing, " and ")),
				"set "+strings.Join(missing, " and ")+" (docs/security.md), or listen on 127.0.0.1")
		}
	}
	if (s.TLS.CertFile == "") != (s.TLS.KeyFile == "") {
		e.Add("server.tls", "cert_file and key_file must be set together", "set both, or neither")
	}
	if s.TLS.CAFile != "" && s.TLS.CertFile == "" {
		e.Add("server.tls.ca_file", "set without cert_file", "mutual TLS needs the server's own cert_file and key_file too")
	}
	for _, f := range []struct{ key, path string }{{"server.tls.cert_file", s.TLS.CertFile}, {"server.tls.ca_file", s.TLS.CAFile}} {
		if f.path != "" {
			if _, err := loadCAs(f.path); err != nil {
				e.Add(f.key, err.Error(), "point it at a readable PEM file")
			}
		}
	}
	if s.TLS.KeyFile != "" {
		if err := checkSecretFile(s.TLS.KeyFile); err != nil {
			e.Add("server.tls.key_file", err.Error(), secretFix(s.TLS.KeyFile, err))
		}
	}
	seen := map[string]bool{}
	for i, u := range s.Users {
		key := fmt.Sprintf("server.users[%d]", i)
		if !userName.MatchString(u.User) {
			e.Add(key+".user", fmt.Sprintf("%q: not a usable NATS user name", u.User), "use 1-64 letters, digits, - and _")
		} else if seen[u.User] || u.User == internalUser {
			e.Add(key+".user", fmt.Sprintf("%q: used twice (or reserved)", u.User), "give each user its own name")
		}
		seen[u.User] = true
		switch {
		case (u.PasswordFile == "") == (u.Nkey == ""):
			e.Add(key, "needs exactly one of password_file and nkey", "set password_file (a bcrypt hash from `nats server passwd`) or nkey (the public U… key)")
		case u.PasswordFile != "":
			if err := checkSecretFile(u.PasswordFile); err != nil {
				e.Add(key+".password_file", err.Error(), secretFix(u.PasswordFile, err))
			}
		case !nkeys.IsValidPublicUserKey(u.Nkey):
			e.Add(key+".nkey", "not a public user nkey", "use the U… public key (nk -inkey seed -pubout), never the seed")
		}
		if u.Ordered && u.Role != RoleSubscriber {
			e.Add(key+".ordered", "only for role subscriber", "remove it")
		}
		if u.OrderedSlots != 0 && (!u.Ordered || u.OrderedSlots < 0 || u.OrderedSlots > roles.MaxOrderedSlots) {
			e.Add(key+".ordered_slots", fmt.Sprintf("%d: only with ordered: true, 1..%d", u.OrderedSlots, roles.MaxOrderedSlots),
				fmt.Sprintf("set ordered: true and 1..%d ordered consumers at once (0: %d), or remove it", roles.MaxOrderedSlots, roles.DefaultOrderedSlots))
		}
		switch u.Role {
		case RoleAgent:
			if !subjectToken(u.Node) {
				e.Add(key+".node", fmt.Sprintf("%q: an agent needs the node it publishes for", u.Node), "set node to the agent's node (its subject token)")
			}
		case RoleCollector, RoleSubscriber:
			if u.Durable != "" && !subjectToken(u.Durable) {
				e.Add(key+".durable", fmt.Sprintf("%q: not a consumer name", u.Durable), "use letters, digits, - and _")
			}
		case RoleAdmin, RoleInventory:
		default:
			e.Add(key+".role", fmt.Sprintf("%q: unknown role", u.Role), "use agent, collector, inventory, subscriber or admin")
		}
	}
	// Each consumer name belongs to one user: its rights are by name.
	for _, cf := range roles.Conflicts(roleUsers(s.Users, c.Collector.Durable), c.Collector.Durable) {
		e.Add(fmt.Sprintf("server.users[%d]", cf.User), cf.Problem+": the one could update, pull from or delete the other's consumer",
			"give each user consumer names of its own: rename the durable or the user (ordered slots are <user>-0, <user>-1, …)")
	}
}

func subjectToken(s string) bool { return s != "" && !strings.ContainsAny(s, ".*> \t") }

// loopbackListen reports whether host:port binds only loopback.
func loopbackListen(listen string) bool {
	h, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// applyServerSecurity adds TLS and users to the embedded server's
// options. It returns the in-process password of internalUser ("" when
// the server has no users): a random secret of this process, never
// stored, valid only for in-process connections.
func applyServerSecurity(opts *server.Options, s ServerConfig, collectorDurable string) (string, error) {
	if s.TLS.CertFile != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: s.TLS.CertFile, KeyFile: s.TLS.KeyFile, CaFile: s.TLS.CAFile, Verify: s.TLS.CAFile != "",
		})
		if err != nil {
			return "", fmt.Errorf("nats.server.tls: %w", err)
		}
		opts.TLS, opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = true, tc, s.TLS.CAFile != "", 5
	}
	if len(s.Users) == 0 {
		return "", nil
	}
	all := UserPermissions(s.Users, collectorDurable)
	for _, u := range s.Users {
		p := all[u.User]
		perms := &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: p.Publish},
			Subscribe: &server.SubjectPermission{Allow: p.Subscribe},
		}
		if p.AllowResponses {
			perms.Response = &server.ResponsePermission{MaxMsgs: 1}
		}
		if u.Nkey != "" {
			opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.Nkey, Permissions: perms})
			continue
		}
		pw, err := readSecret(fmt.Sprintf("server.users[%s].password_file", u.User), u.PasswordFile)
		if err != nil {
			return "", err
		}
		opts.Users = append(opts.Users, &server.User{Username: u.User, Password: pw, Permissions: perms})
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("embedded nats: internal password: %w", err)
	}
	pw := hex.EncodeToString(b)
	opts.Users = append(opts.Users, &server.User{Username: internalUser, Password: pw,
		AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeInProcess: {}}})
	return pw, nil
}
