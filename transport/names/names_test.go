package names_test

import (
	"testing"

	"github.com/tapflow/tapflow/transport/names"
)

// TestNamesPinned: operators' nats-server configurations and the
// collectors' existing durables use these literals; a rename breaks
// every deployed fleet, so it must fail here first.
func TestNamesPinned(t *testing.T) {
	for _, c := range [][2]string{
		{names.FlowsStream, "TAPFLOW_FLOWS"},
		{names.FlowsSubjectRoot, "tapflow.flows.v1"},
		{names.MetersStream, "TAPFLOW_METERS"},
		{names.MetersSubjectRoot, "tapflow.meters.v1"},
		{names.DLQStream, "TAPFLOW_DLQ"},
		{names.DLQSubjectRoot, "tapflow.dlq"},
		{names.DefaultDurable, "tapflow-collector"},
		{names.MetersDurableSuffix, "-meters"},
		{names.InventoryBucket, "TAPFLOW_INVENTORY"},
		{names.InventoryStream, "OBJ_TAPFLOW_INVENTORY"},
		{names.InventoryObject, "snapshot"},
		{names.InventoryLeaseBucket, "TAPFLOW_INVENTORY_LEASE"},
		{names.InventoryLeaseStream, "KV_TAPFLOW_INVENTORY_LEASE"},
		{names.InventoryDeltaSubject, "tapflow.inventory.delta"},
		{names.InventoryCurrentSubject, "tapflow.inventory.current"},
		{names.InventoryLookupSubject, "tapflow.inventory.lookup"},
		{names.InventoryNodesStream, "TAPFLOW_INVENTORY_NODES"},
		{names.InventoryNodeRoot, "tapflow.inventory.node"},
		{names.InventorySumsConsumer, "tapflow-inventory-sums"},
		{names.InventoryMetaSubject, "$O.TAPFLOW_INVENTORY.M.c25hcHNob3Q="},
	} {
		if c[0] != c[1] {
			t.Errorf("name changed: %q, deployed configurations use %q", c[0], c[1])
		}
	}
}
