package roles

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ServerConf is a nats-server configuration for a fleet: listener, TLS,
// JetStream store and one user per process, each with For's lists.
type ServerConf struct {
	Listen                    string
	CertFile, KeyFile, CAFile string
	StoreDir                  string
	Users                     []User
}

// PasswordVar is the environment variable the configuration reads u's
// password from: agent-cmp1 → $AGENT_CMP1_PASSWORD.
func PasswordVar(name string) string {
	return strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_PASSWORD"
}

// Render is the configuration in nats-server's syntax; passwords come from
// PasswordVar variables.
func (c ServerConf) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\n", c.Listen)
	if c.CertFile != "" {
		fmt.Fprintf(&b, "tls {\n  cert_file: %q\n  key_file: %q\n", c.CertFile, c.KeyFile)
		if c.CAFile != "" {
			fmt.Fprintf(&b, "  ca_file: %q\n  verify: true\n", c.CAFile)
		}
		b.WriteString("}\n")
	}
	fmt.Fprintf(&b, "jetstream { store_dir: %q }\n", c.StoreDir)
	b.WriteString("authorization {\n  users: [\n")
	for _, u := range c.Users {
		p := For(u)
		fmt.Fprintf(&b, "    # %s\n", describe(u))
		fmt.Fprintf(&b, "    { user: %s, password: $%s,\n      permissions: {\n", u.Name, PasswordVar(u.Name))
		fmt.Fprintf(&b, "        publish: { allow: %s }\n", list(p.Publish, 10))
		fmt.Fprintf(&b, "        subscribe: { allow: %s }\n", list(p.Subscribe, 10))
		if p.AllowResponses {
			b.WriteString("        allow_responses: true\n")
		}
		b.WriteString("      } }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// list renders subjects as a nats-server array, one per line.
func list(s []string, indent int) string {
	if len(s) == 1 {
		return fmt.Sprintf("[%q]", s[0])
	}
	pad := strings.Repeat(" ", indent+2)
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return "[\n" + pad + strings.Join(q, ",\n"+pad) + "]"
}

func describe(u User) string {
	switch {
	case u.Role == Agent:
		return "agent of node " + u.Node
	case u.Role == Collector:
		c := CollectorDurables(u.Durable)
		return "collector, durables " + c[0] + " and " + c[1]
	case u.Role == Subscriber && u.Ordered && u.Durable != "":
		return "subscriber: durable " + u.Durable + " and ordered consumers " + slots(u)
	case u.Role == Subscriber && u.Ordered:
		return "subscriber: ordered consumers " + slots(u) + " (tapflow tap, transport/ordered)"
	case u.Role == Subscriber:
		return "subscriber: durable " + u.Durable
	case u.Role == Inventory:
		return "tapflow inventory serve"
	}
	return string(u.Role)
}

// slots is u's slot names as a range: tap-0 … tap-3.
func slots(u User) string {
	n := OrderedNames(u.Name, u.Slots)
	if len(n) == 1 {
		return n[0]
	}
	return n[0] + " … " + n[len(n)-1]
}

// Example is the fleet docs/security.md shows: two agents, a collector
// with the default durable, the inventory service, a subscriber with a
// pre-created durable, two ordered subscribers (the default slots and
// two) and an operator.
func Example() ServerConf {
	return ServerConf{
		Listen:   "0.0.0.0:4222",
		CertFile: "/etc/nats/server.pem", KeyFile: "/etc/nats/server-key.pem", CAFile: "/etc/nats/ca.pem",
		StoreDir: "/var/lib/nats",
		Users: []User{
			{Name: "agent-cmp1", Role: Agent, Node: "cmp1"},
			{Name: "agent-cmp2", Role: Agent, Node: "cmp2"},
			{Name: "collector", Role: Collector},
			{Name: "inventory", Role: Inventory},
			{Name: "analytics", Role: Subscriber, Durable: "analytics"},
			{Name: "tap", Role: Subscriber, Ordered: true},
			{Name: "replay", Role: Subscriber, Ordered: true, Slots: 2},
			{Name: "ops", Role: Admin},
		},
	}
}

// row is one line of the permission table, with placeholders.
type row struct {
	label string
	u     User
	why   string
}

var rows = []row{
	{"agent (one per node)", User{Name: "<user>", Role: Agent, Node: "<node>"},
		"its node's batches; waits for the streams (`nats.manage_streams: false`: no stream create or update); with `inventory.provider: nats` reads the snapshot (direct gets), its announcements and deltas, and asks lookups; with `inventory.scope: node` its own node's overlay (`" + InventoryNodeRoot + ".<node>`, the direct get naming it); writes nothing else, creates no consumer"},
	{"collector", User{Name: "<user>", Role: Collector, Durable: "<durable>"},
		"sets up the streams and **its** durables (`<durable>`, `<durable>-meters`; default `tapflow-collector`), consumes, acks, dead-letters (on `tapflow.dlq.<flows\\|meters>.<node>`, evicting a node's own oldest letters beyond `collector.dlq_letters_per_node`, [delivery.md](delivery.md#dead-letters-per-sender))"},
	{"inventory (`tapflow inventory serve`)", User{Name: "<user>", Role: Inventory},
		"the snapshot store (`" + InventoryStream + "`: put, purge of a replaced version), the lease (`" + LeaseStream + "`), deltas, current-notes, lookup answers (`allow_responses`), every node's overlay (`" + InventoryNodesStream + "`) and, on taking the lease, their sums (consumer `" + InventorySumsConsumer + "`: headers only)"},
	{"subscriber with `durable: <durable>`", User{Name: "<user>", Role: Subscriber, Durable: "<durable>"},
		"reads live (core NATS) and from its durable, which it may create or update (as the example subscribers do at start); no other consumer, by any name"},
	{"subscriber with `ordered: true`", User{Name: "<user>", Role: Subscriber, Ordered: true, Slots: 1},
		"creates, pulls, deletes and recreates ordered consumers under its own slot names only, `<user>-<i>` for i in 0 … `ordered_slots`-1 (default " + strconv.Itoa(DefaultOrderedSlots) + "; `tapflow tap` takes a free one, [subscribers.md](subscribers.md#ordered-consumers-on-a-secured-server)); no other consumer, by any name, so nothing of the collectors' or another subscriber's whatever `collector.durable` is; the nameless create is not allowed; no acks"},
	{"admin (operators, `tapflow dlq`)", User{Name: "<user>", Role: Admin}, "everything"},
}

// Table is the permission table in Markdown, with placeholders for what
// varies (<node>, <durable>, <user>, <i>); only limits it to those roles
// (none: all).
func Table(only ...Role) string {
	var b strings.Builder
	b.WriteString("| role | publishes | subscribes | what for |\n|---|---|---|---|\n")
	for _, r := range rows {
		if len(only) > 0 && !contains(only, r.u.Role) {
			continue
		}
		p := For(r.u)
		for i, s := range p.Publish { // one slot shown as the pattern of all
			p.Publish[i] = strings.ReplaceAll(s, ".<user>-0", ".<user>-<i>")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.label, cell(p.Publish), cell(p.Subscribe), r.why)
	}
	return b.String()
}

func contains(rs []Role, r Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func cell(s []string) string {
	if len(s) == 0 {
		return "—"
	}
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = "`" + v + "`"
	}
	return strings.Join(q, "<br>")
}

// Region names a generated part of a doc.
type Region struct {
	File, Name string
	Render     func() string
}

// Regions are the generated parts of the docs, each between
// <!-- roles:begin NAME --> and <!-- roles:end NAME -->.
var Regions = []Region{
	{"docs/security.md", "table", func() string { return Table() }},
	{"docs/security.md", "nats-server.conf", func() string { return "```\n" + Example().Render() + "```\n" }},
	{"docs/inventory-service.md", "table", func() string { return Table(Agent, Inventory) }},
}

// Update replaces the generated regions of file's text with their
// current rendering; it fails when a region's markers are missing.
func Update(file, text string) (string, error) {
	for _, r := range Regions {
		if r.File != file {
			continue
		}
		begin, end := "<!-- roles:begin "+r.Name+" -->\n", "<!-- roles:end "+r.Name+" -->"
		re := regexp.MustCompile("(?s)" + regexp.QuoteMeta(begin) + ".*?" + regexp.QuoteMeta(end))
		if !re.MatchString(text) {
			return "", fmt.Errorf("%s: no %q … %q region (generated from transport/roles)", file, strings.TrimSpace(begin), end)
		}
		body := begin + "<!-- generated from transport/roles by make generate: do not edit -->\n" + r.Render() + end
		text = re.ReplaceAllLiteralString(text, body)
	}
	return text, nil
}
