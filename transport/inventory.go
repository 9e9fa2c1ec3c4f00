package transport

import "github.com/tapflow/tapflow/transport/names"

// Inventory names on the bus, beside the record subjects (transport.go):
// where `tapflow inventory serve` publishes the inventory and the agents
// (inventory.provider: nats) read it. They are transport/names' (see
// there for each), which the NATS permissions (transport/roles) use too;
// operators' nats-server configurations name them: never rename them. The formats on these subjects are enrich/provider/natsinv's
// (snapshot, deltas, "still current" notes), enrich/lookup's (lookups) and
// enrich/nodeview's (overlays).
const (
	InventoryBucket         = names.InventoryBucket
	InventoryStream         = names.InventoryStream
	InventoryObject         = names.InventoryObject
	InventoryLeaseBucket    = names.InventoryLeaseBucket
	InventoryLeaseStream    = names.InventoryLeaseStream
	InventoryDeltaSubject   = names.InventoryDeltaSubject
	InventoryCurrentSubject = names.InventoryCurrentSubject
	InventoryLookupSubject  = names.InventoryLookupSubject
	InventoryNodesStream    = names.InventoryNodesStream
	InventoryNodeRoot       = names.InventoryNodeRoot
	InventorySumsConsumer   = names.InventorySumsConsumer
)

// InventoryMetaSubject is where each put of the snapshot announces itself;
// agents subscribe to it to learn of a new version.
var InventoryMetaSubject = names.InventoryMetaSubject

// InventoryChunksSubject is the subject of the snapshot's chunks of the
// object version nuid (every version when nuid is ">").
func InventoryChunksSubject(nuid string) string { return "$O." + InventoryBucket + ".C." + nuid }

// InventoryNodeSubject is node's overlay subject.
func InventoryNodeSubject(node string) string { return InventoryNodeRoot + "." + node }
