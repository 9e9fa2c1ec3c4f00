// Package names holds every name tapflow uses on the bus: streams,
// subjects, buckets and the collectors' durable consumers. It imports no
// project package, so both transport (which uses the names) and
// transport/roles (whose NATS permissions name them, and which transport
// imports) take them from here. Operators' nats-server configurations
// name them too (docs/security.md, docs/inventory-service.md): never
// rename them (TestNamesPinned).
package names

import "encoding/base64"

// Records and dead letters (DESIGN §5).
const (
	FlowsStream       = "TAPFLOW_FLOWS"
	FlowsSubjectRoot  = "tapflow.flows.v1" // + ".<node>"
	MetersStream      = "TAPFLOW_METERS"
	MetersSubjectRoot = "tapflow.meters.v1" // + ".<node>"
	DLQStream         = "TAPFLOW_DLQ"
	DLQSubjectRoot    = "tapflow.dlq"
)

// The collectors' durable consumers: collector.durable's default, and
// the meters consumer is "<durable>-meters".
const (
	DefaultDurable      = "tapflow-collector"
	MetersDurableSuffix = "-meters"
)

// The inventory: where `tapflow inventory serve` publishes it and the
// agents (inventory.provider: nats) read it.
const (
	// InventoryBucket is the Object Store bucket holding the snapshot.
	InventoryBucket = "TAPFLOW_INVENTORY"
	// InventoryStream is InventoryBucket's stream (nats.go's OBJ_<bucket>).
	InventoryStream = "OBJ_" + InventoryBucket
	// InventoryObject is the snapshot's name in InventoryBucket.
	InventoryObject = "snapshot"
	// InventoryLeaseBucket is the KV bucket of the serve instances' lease
	// (which one publishes).
	InventoryLeaseBucket = "TAPFLOW_INVENTORY_LEASE"
	// InventoryLeaseStream is InventoryLeaseBucket's stream (KV_<bucket>).
	InventoryLeaseStream = "KV_" + InventoryLeaseBucket
	// InventoryDeltaSubject carries deltas (core NATS, not stored).
	InventoryDeltaSubject = "tapflow.inventory.delta"
	// InventoryCurrentSubject carries the service's "version V is still
	// current, as read at T" notes.
	InventoryCurrentSubject = "tapflow.inventory.current"
	// InventoryLookupSubject carries an agent's targeted lookup of one MAC.
	InventoryLookupSubject = "tapflow.inventory.lookup"
	// InventoryNodesStream holds each node's overlay (node-scoped views)
	// on InventoryNodeRoot.<node>, one message per node.
	InventoryNodesStream = "TAPFLOW_INVENTORY_NODES"
	// InventoryNodeRoot is the root of the overlays' subjects.
	InventoryNodeRoot = "tapflow.inventory.node"
	// InventorySumsConsumer is the consumer a new leader reads the
	// overlays' sums with (headers only).
	InventorySumsConsumer = "tapflow-inventory-sums"
)

// InventoryMetaSubject is where each put of the snapshot announces itself
// (the Object Store's meta subject of InventoryObject): agents subscribe
// to it to learn of a new version.
var InventoryMetaSubject = "$O." + InventoryBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(InventoryObject))
