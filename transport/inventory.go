package transport

import "encoding/base64"

// Inventory names on the bus, beside the record subjects (transport.go):
// where `tapflow inventory serve` publishes the inventory and the agents
// (inventory.provider: nats) read it. The NATS permissions of the
// inventory role and of the agents name them (transport/roles, which
// mirrors them: TestNamesAgree), and so do operators' nats-server
// configurations (docs/security.md, docs/inventory-service.md): never
// rename them. The formats on these subjects are enrich/provider/natsinv's
// (snapshot, deltas, "still current" notes), enrich/lookup's (lookups) and
// enrich/nodeview's (overlays).
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
	// on InventoryNodeSubject(node), one message per node.
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

// InventoryChunksSubject is the subject of the snapshot's chunks of the
// object version nuid (every version when nuid is ">").
func InventoryChunksSubject(nuid string) string { return "$O." + InventoryBucket + ".C." + nuid }

// InventoryNodeSubject is node's overlay subject.
func InventoryNodeSubject(node string) string { return InventoryNodeRoot + "." + node }
