// Package roles is the one source of the NATS permissions of tapflow's
// processes: for each role (agent, collector, inventory service,
// subscriber, admin) what its user may publish and subscribe to. The
// embedded server (nats.server.users) applies these lists, and the
// permission tables and the nats-server configuration in docs/security.md
// and docs/inventory-service.md are generated from them (make generate),
// so what the docs prescribe is what the code and the tests use.
//
// A role's lists name only what its job needs. NATS matches permissions
// per subject token, so a consumer's rights can only be pinned by its
// whole name: a subscriber's pre-created durable is allowed by name, and
// an ordered subscriber, whose consumers the client names, is refused
// every consumer the fleet protects (each collector's durables, each
// subscriber's durable, whatever they are configured to: to create,
// pull from or delete), and never allowed the nameless create whose name
// rides in the request body. The docs' nats-server configuration is
// run by TestRolesOnExternalServer on Debian's nats-server, every
// forbidden action tried.
package roles

//go:generate go run ./internal/rolesdoc ../..

import (
	"encoding/base64"
	"slices"
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

// Names the permissions refer to. transport and enrich/provider/natsinv
// define the same names; roles_test checks they agree.
const (
	FlowsStream         = "TAPFLOW_FLOWS"
	FlowsSubjectRoot    = "tapflow.flows.v1"
	MetersStream        = "TAPFLOW_METERS"
	MetersSubjectRoot   = "tapflow.meters.v1"
	DLQStream           = "TAPFLOW_DLQ"
	DLQSubjects         = "tapflow.dlq.>"
	DefaultDurable      = "tapflow-collector"
	MetersDurableSuffix = "-meters"

	InventoryBucket  = "TAPFLOW_INVENTORY"
	InventoryStream  = "OBJ_" + InventoryBucket
	InventoryObject  = "snapshot"
	LeaseBucket      = "TAPFLOW_INVENTORY_LEASE"
	LeaseStream      = "KV_" + LeaseBucket
	InventoryDelta   = "tapflow.inventory.delta"
	InventoryCurrent = "tapflow.inventory.current"
	InventoryLookup  = "tapflow.inventory.lookup"
	// InventoryNodesStream holds each node's overlay (node-scoped
	// views) on InventoryNodeRoot.<node> (enrich/nodeview).
	InventoryNodesStream = "TAPFLOW_INVENTORY_NODES"
	InventoryNodeRoot    = "tapflow.inventory.node"
)

// InventoryMeta is the subject each put of the inventory snapshot
// announces itself on (agents watch it).
var InventoryMeta = "$O." + InventoryBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(InventoryObject))

// User is one NATS user: its name (also its reply inbox, _INBOX.<name>)
// and what its permissions depend on.
type User struct {
	Name string
	Role Role
	// Node is the node an agent publishes for.
	Node string
	// Durable is a collector's flows consumer (default tapflow-collector;
	// its meters consumer is Durable-meters), or the pre-created durable
	// a subscriber may read and ack.
	Durable string
	// Ordered lets a subscriber create ephemeral ordered consumers
	// (tapflow tap, replays from a point in time).
	Ordered bool
}

// Permissions is what one user may do. Deny wins over allow.
type Permissions struct {
	Publish, PublishDeny []string
	Subscribe            []string
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

// Protected lists the consumers no subscriber may create, update, delete,
// pull from or ack on unless it is its own: the default collector's
// durables, those of every collector in users and of every extra
// collector durable (the embedded server's own collector.durable), and
// every subscriber's durable. Sorted, without duplicates.
func Protected(users []User, extra ...string) []string {
	var p []string
	add := func(d string) { c := CollectorDurables(d); p = append(p, c[0], c[1]) }
	add("")
	for _, d := range extra {
		add(d)
	}
	for _, u := range users {
		switch {
		case u.Role == Collector:
			add(u.Durable)
		case u.Role == Subscriber && u.Durable != "":
			p = append(p, u.Durable)
		}
	}
	slices.Sort(p)
	return slices.Compact(p)
}

// For is u's permissions; protected is Protected of the whole user list
// (what an ordered subscriber is refused).
func For(u User, protected []string) Permissions {
	inbox := "_INBOX." + u.Name + ".>"
	info := func(streams ...string) []string {
		s := []string{"$JS.API.INFO"}
		for _, st := range streams {
			s = append(s, "$JS.API.STREAM.INFO."+st)
		}
		return s
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
			p = append(p, "$JS.API.CONSUMER.CREATE."+sc[0]+"."+sc[1], "$JS.API.CONSUMER.CREATE."+sc[0]+"."+sc[1]+".>",
				"$JS.API.CONSUMER.DURABLE.CREATE."+sc[0]+"."+sc[1])
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
		// Node-scoped views: every node's overlay.
		p = append(p, "$JS.API.STREAM.INFO."+InventoryNodesStream, "$JS.API.STREAM.CREATE."+InventoryNodesStream,
			"$JS.API.STREAM.UPDATE."+InventoryNodesStream, InventoryNodeRoot+".*")
		return Permissions{Publish: p, Subscribe: []string{inbox, InventoryLookup}, AllowResponses: true}
	case Subscriber:
		p := info(FlowsStream, MetersStream)
		if u.Durable != "" {
			p = append(p, use(FlowsStream, u.Durable)...)
			p = append(p, use(MetersStream, u.Durable)...)
		}
		var deny []string
		if u.Ordered {
			// The client names ordered consumers (and deletes each one it
			// replaces), so the allow list cannot pin the name: every
			// protected consumer is denied (a create under an existing
			// name updates it, a pull takes its messages, a delete stops
			// its reader), its own durable aside. Acks are never allowed:
			// ordered consumers do not ack.
			// Only the named create is allowed: the nameless one takes
			// the name from the request body, where no permission looks.
			for _, st := range []string{FlowsStream, MetersStream} {
				p = append(p, "$JS.API.CONSUMER.CREATE."+st+".*", "$JS.API.CONSUMER.CREATE."+st+".*.>",
					"$JS.API.CONSUMER.INFO."+st+".*", "$JS.API.CONSUMER.MSG.NEXT."+st+".*", "$JS.API.CONSUMER.DELETE."+st+".*")
			}
			for _, c := range protected {
				if c == u.Durable {
					continue
				}
				for _, st := range []string{FlowsStream, MetersStream} {
					deny = append(deny, "$JS.API.CONSUMER.CREATE."+st+"."+c, "$JS.API.CONSUMER.CREATE."+st+"."+c+".>",
						"$JS.API.CONSUMER.MSG.NEXT."+st+"."+c, "$JS.API.CONSUMER.DELETE."+st+"."+c)
				}
			}
		}
		return Permissions{Publish: p, PublishDeny: deny, Subscribe: []string{inbox, FlowsSubjectRoot + ".>", MetersSubjectRoot + ".>"}}
	}
	return Permissions{Publish: []string{">"}, Subscribe: []string{">"}} // admin
}

// CollectorConsumer reports whether consumer is a collector's durable
// (flows or meters) among users and the extra collector durables.
func CollectorConsumer(consumer string, users []User, extra ...string) bool {
	is := func(d string) bool { c := CollectorDurables(d); return consumer == c[0] || consumer == c[1] }
	if is("") {
		return true
	}
	for _, d := range extra {
		if is(d) {
			return true
		}
	}
	for _, u := range users {
		if u.Role == Collector && is(u.Durable) {
			return true
		}
	}
	return false
}
