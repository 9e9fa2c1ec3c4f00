// Package roles is the one source of the NATS permissions of tapflow's
// processes: for each role (agent, collector, inventory service,
// subscriber, admin) what its user may publish and subscribe to. The
// embedded server (nats.server.users) applies these lists, and the
// permission tables and the nats-server configuration in docs/security.md
// and docs/inventory-service.md are generated from them (make generate),
// so what the docs prescribe is what the code and the tests use.
//
// A role's lists name only what its job needs. NATS matches permissions
// per subject token and a consumer's name is one token, so every
// consumer right is granted by whole name, never by wildcard: a
// collector gets its two durables, a subscriber its durable (create,
// pull, ack) and, with ordered, a few slot names of its own
// (OrderedNames: <user>-0 … <user>-N-1) that transport/ordered creates,
// recreates and deletes. Whatever a user does not own by name it cannot
// touch, whatever collector.durable or a hand-made consumer is called;
// Conflicts refuses configurations where two users would own one name.
// The nameless create, whose name rides in the request body, is never
// allowed. The docs' nats-server configuration is run by
// TestRolesOnExternalServer on Debian's nats-server, every forbidden
// action tried.
package roles

//go:generate go run ./internal/rolesdoc ../..

import (
	"fmt"
	"strconv"

	"github.com/tapflow/tapflow/transport/names"
)

// Role is what a NATS user is for.
type Role string

// The roles of nats.server.users.
const (
	Agent      Role = "agent"      // one per node: publishes its node's batches
	Collector  Role = "collector"  // consumes, acks, dead-letters, manages the streams
	Inventory  Role = "inventory"  // tapflow inventory serve: publishes the inventory
	Subscriber Role = "subscriber" // reads records, changes nothing
	Admin      Role = "admin"      // operators, tapflow dlq: everything
)

// Names the permissions refer to: transport/names', which transport
// uses too (roles cannot import transport, which imports it).
const (
	FlowsStream         = names.FlowsStream
	FlowsSubjectRoot    = names.FlowsSubjectRoot
	MetersStream        = names.MetersStream
	MetersSubjectRoot   = names.MetersSubjectRoot
	DLQStream           = names.DLQStream
	DLQSubjects         = names.DLQSubjectRoot + ".>"
	DefaultDurable      = names.DefaultDurable
	MetersDurableSuffix = names.MetersDurableSuffix

	InventoryBucket       = names.InventoryBucket
	InventoryStream       = names.InventoryStream
	InventoryObject       = names.InventoryObject
	LeaseBucket           = names.InventoryLeaseBucket
	LeaseStream           = names.InventoryLeaseStream
	InventoryDelta        = names.InventoryDeltaSubject
	InventoryCurrent      = names.InventoryCurrentSubject
	InventoryLookup       = names.InventoryLookupSubject
	InventoryNodesStream  = names.InventoryNodesStream
	InventoryNodeRoot     = names.InventoryNodeRoot
	InventorySumsConsumer = names.InventorySumsConsumer
)

// InventoryMeta is the subject each put of the inventory snapshot
// announces itself on (agents watch it).
var InventoryMeta = names.InventoryMetaSubject

// User is one NATS user: its name (also its reply inbox, _INBOX.<name>)
// and what its permissions depend on.
type User struct {
	Name string
	Role Role
	// Node is the node an agent publishes for.
	Node string
	// Durable is a collector's flows consumer (default tapflow-collector;
	// its meters consumer is Durable-meters), or the durable a subscriber
	// may create (or update), read and ack.
	Durable string
	// Ordered lets a subscriber create ephemeral ordered consumers
	// (tapflow tap, replays from a point in time) under its slot names.
	Ordered bool
	// Slots is how many ordered consumers it may hold at once (0:
	// DefaultOrderedSlots): one per running tap or replay.
	Slots int
}

// DefaultOrderedSlots is how many ordered consumers an ordered subscriber
// holds at once unless configured (nats.server.users[].ordered_slots).
const DefaultOrderedSlots = 4

// MaxOrderedSlots bounds ordered_slots: each slot is 5 permissions per
// stream in the user's lists.
const MaxOrderedSlots = 64

// OrderedNames are the consumer names an ordered subscriber named user
// with slots slots (0: DefaultOrderedSlots) may create, pull from and
// delete: user-0 … user-(slots-1), the same on each stream.
func OrderedNames(user string, slots int) []string {
	if slots <= 0 {
		slots = DefaultOrderedSlots
	}
	n := make([]string, slots)
	for i := range n {
		n[i] = user + "-" + strconv.Itoa(i)
	}
	return n
}

// Permissions is what one user may do: allow lists only, nothing is
// granted by a wildcard over consumer names and then denied back.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// AllowResponses lets the user answer requests on whatever reply
	// subject they carry, once each (the inventory service's lookups).
	AllowResponses bool
}

// CollectorDurables are the consumers of a collector whose flows durable
// is durable ("" is the default): flows, then meters.
func CollectorDurables(durable string) [2]string {
	if durable == "" {
		durable = DefaultDurable
	}
	return [2]string{durable, durable + MetersDurableSuffix}
}

// For is u's permissions.
func For(u User) Permissions {
	inbox := "_INBOX." + u.Name + ".>"
	info := func(streams ...string) []string {
		s := []string{"$JS.API.INFO"}
		for _, st := range streams {
			s = append(s, "$JS.API.STREAM.INFO."+st)
		}
		return s
	}
	// create is the named create (the name in the subject, with or
	// without a filter after it); the nameless create carries the name
	// in its body, where no permission looks, and is never allowed.
	create := func(stream, consumer string) []string {
		return []string{"$JS.API.CONSUMER.CREATE." + stream + "." + consumer, "$JS.API.CONSUMER.CREATE." + stream + "." + consumer + ".>"}
	}
	use := func(stream, consumer string) []string {
		return []string{
			"$JS.API.CONSUMER.INFO." + stream + "." + consumer,
			"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer,
			"$JS.ACK." + stream + "." + consumer + ".>",
		}
	}
	switch u.Role {
	case Agent:
		// Its node's subjects; stream info to wait for the streams
		// (nats.manage_streams: false: no create, no update). Inventory
		// (inventory.provider: nats): read the snapshot with direct gets
		// (the bare subject carries a by-sequence request in its body,
		// .> the last-message-by-subject form), watch its announcements
		// and deltas, ask targeted lookups. Nothing that writes the
		// inventory stream, and no consumer anywhere.
		pub := []string{FlowsSubjectRoot + "." + u.Node, MetersSubjectRoot + "." + u.Node}
		pub = append(pub, info(FlowsStream, MetersStream, InventoryStream)...)
		pub = append(pub, "$JS.API.DIRECT.GET."+InventoryStream, "$JS.API.DIRECT.GET."+InventoryStream+".>", InventoryLookup)
		// Node-scoped views: its node's overlay, by the direct get
		// whose subject names the node (never the bare form, whose body
		// could name another) and live on its node's subject.
		overlay := InventoryNodeRoot + "." + u.Node
		pub = append(pub, "$JS.API.DIRECT.GET."+InventoryNodesStream+"."+overlay)
		return Permissions{Publish: pub, Subscribe: []string{inbox, InventoryMeta, InventoryDelta, InventoryCurrent, overlay}}
	case Collector:
		p := info(FlowsStream, MetersStream, DLQStream)
		for _, st := range []string{FlowsStream, MetersStream, DLQStream} {
			// LIST: the backlog gauges of every consumer (names and counts).
			p = append(p, "$JS.API.STREAM.CREATE."+st, "$JS.API.STREAM.UPDATE."+st, "$JS.API.CONSUMER.LIST."+st)
		}
		c := CollectorDurables(u.Durable)
		for _, sc := range [][2]string{{FlowsStream, c[0]}, {MetersStream, c[1]}} {
			p = append(p, create(sc[0], sc[1])...)
			p = append(p, "$JS.API.CONSUMER.DURABLE.CREATE."+sc[0]+"."+sc[1])
			p = append(p, use(sc[0], sc[1])...)
		}
		// Dead letters go to tapflow.dlq.<flows|meters>.<node>; the
		// collector reads and deletes a node's oldest letters beyond
		// collector.dlq_letters_per_node (one sender cannot evict another's).
		p = append(p, DLQSubjects, "$JS.API.STREAM.MSG.GET."+DLQStream, "$JS.API.STREAM.MSG.DELETE."+DLQStream)
		return Permissions{Publish: p, Subscribe: []string{inbox}}
	case Inventory:
		// The snapshot store (an Object Store: its stream, chunk and meta
		// subjects, the purge of a replaced version's chunks), the lease
		// bucket (a KV) that elects one publishing instance, deltas and
		// "still current" notes, and answers to lookups.
		p := info(InventoryStream, LeaseStream)
		for _, st := range []string{InventoryStream, LeaseStream} {
			p = append(p, "$JS.API.STREAM.CREATE."+st, "$JS.API.STREAM.UPDATE."+st, "$JS.API.DIRECT.GET."+st+".>")
		}
		p = append(p, "$JS.API.STREAM.PURGE."+InventoryStream, "$O."+InventoryBucket+".>", "$KV."+LeaseBucket+".>",
			InventoryDelta, InventoryCurrent)
		// Node-scoped views: every node's overlay, and an ordered
		// consumer of their headers (a new leader republishes only the
		// overlays whose sum differs).
		p = append(p, "$JS.API.STREAM.INFO."+InventoryNodesStream, "$JS.API.STREAM.CREATE."+InventoryNodesStream,
			"$JS.API.STREAM.UPDATE."+InventoryNodesStream, InventoryNodeRoot+".*")
		p = append(p, create(InventoryNodesStream, InventorySumsConsumer)...)
		p = append(p, use(InventoryNodesStream, InventorySumsConsumer)...)
		p = append(p, "$JS.API.CONSUMER.DELETE."+InventoryNodesStream+"."+InventorySumsConsumer)
		return Permissions{Publish: p, Subscribe: []string{inbox, InventoryLookup}, AllowResponses: true}
	case Subscriber:
		// Its own consumers only, each by name: the durable (created or
		// updated as the example subscribers do at start, pulled, acked)
		// and, ordered, its slots (created, pulled, deleted and
		// recreated under the same name by transport/ordered; AckNone,
		// so no acks). A create under a name updates that consumer and a
		// pull takes its messages, so no other name is allowed.
		p := info(FlowsStream, MetersStream)
		for _, st := range []string{FlowsStream, MetersStream} {
			if u.Durable != "" {
				p = append(p, create(st, u.Durable)...)
				p = append(p, use(st, u.Durable)...)
			}
			if u.Ordered {
				for _, c := range OrderedNames(u.Name, u.Slots) {
					p = append(p, create(st, c)...)
					p = append(p, "$JS.API.CONSUMER.INFO."+st+"."+c, "$JS.API.CONSUMER.MSG.NEXT."+st+"."+c, "$JS.API.CONSUMER.DELETE."+st+"."+c)
				}
			}
		}
		return Permissions{Publish: p, Subscribe: []string{inbox, FlowsSubjectRoot + ".>", MetersSubjectRoot + ".>"}}
	}
	return Permissions{Publish: []string{">"}, Subscribe: []string{">"}} // admin
}

// Conflict is a consumer name two users would both own: either could
// update, pull from or delete the other's consumer.
type Conflict struct {
	// User is the index in users of the later owner.
	User int
	Name string
	// Problem names both owners.
	Problem string
}

// Conflicts lists the consumer names owned twice among users and extra,
// the durables of collectors without a user there (the embedded
// server's own collector.durable); the default collector's durables are
// always owned. Collectors may share durables (they split one stream's
// work); no other name may be shared, not even between a user's durable
// and its own slots (the ordered reader deletes what is in its slot).
func Conflicts(users []User, extra ...string) []Conflict {
	type owner struct {
		user      int // -1: a collector durable without a user
		what      string
		collector bool
	}
	owners := map[string]owner{}
	var out []Conflict
	own := func(name string, o owner) {
		prev, ok := owners[name]
		switch {
		case !ok:
			owners[name] = o
		case prev.collector && o.collector:
		default:
			out = append(out, Conflict{User: o.user, Name: name, Problem: fmt.Sprintf("%q is both %s and %s", name, prev.what, o.what)})
		}
	}
	collector := func(i int, who, durable string) {
		c := CollectorDurables(durable)
		own(c[0], owner{i, who + " flows durable", true})
		own(c[1], owner{i, who + " meters durable", true})
	}
	collector(-1, "the default collector's", "")
	for _, d := range extra {
		collector(-1, "collector.durable's", d)
	}
	for i, u := range users {
		switch {
		case u.Role == Collector:
			collector(i, "collector "+u.Name+"'s", u.Durable)
		case u.Role == Subscriber:
			if u.Durable != "" {
				own(u.Durable, owner{user: i, what: "subscriber " + u.Name + "'s durable"})
			}
			if u.Ordered {
				for _, c := range OrderedNames(u.Name, u.Slots) {
					own(c, owner{user: i, what: "ordered subscriber " + u.Name + "'s slot"})
				}
			}
		}
	}
	return out
}
