package transport_test

import (
	"testing"

	"github.com/tapflow/tapflow/transport"
)

// TestInventoryNamesPinned: the inventory's names on the bus are what
// operators' NATS permissions and agents already deployed use; a change
// here is a wire change, not a refactoring.
func TestInventoryNamesPinned(t *testing.T) {
	for _, c := range [][2]string{
		{transport.InventoryBucket, "TAPFLOW_INVENTORY"},
		{transport.InventoryStream, "OBJ_TAPFLOW_INVENTORY"},
		{transport.InventoryObject, "snapshot"},
		{transport.InventoryLeaseBucket, "TAPFLOW_INVENTORY_LEASE"},
		{transport.InventoryLeaseStream, "KV_TAPFLOW_INVENTORY_LEASE"},
		{transport.InventoryDeltaSubject, "tapflow.inventory.delta"},
		{transport.InventoryCurrentSubject, "tapflow.inventory.current"},
		{transport.InventoryLookupSubject, "tapflow.inventory.lookup"},
		{transport.InventoryNodesStream, "TAPFLOW_INVENTORY_NODES"},
		{transport.InventoryNodeSubject("n1"), "tapflow.inventory.node.n1"},
		{transport.InventorySumsConsumer, "tapflow-inventory-sums"},
		{transport.InventoryMetaSubject, "$O.TAPFLOW_INVENTORY.M.c25hcHNob3Q="},
		{transport.InventoryChunksSubject(">"), "$O.TAPFLOW_INVENTORY.C.>"},
	} {
		if c[0] != c[1] {
			t.Errorf("%q, was %q", c[0], c[1])
		}
	}
}
