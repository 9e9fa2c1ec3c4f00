// Package enrich is the attribution stage: it stamps every flow.v1 record
// with tenant, server, port, zone, peer tenant, external network, load
// balancer, segment and metadata version.
//
// An Engine holds the current attribution snapshot (package
// enrich/snapshot) behind an atomic pointer; readers never lock. Run polls
// the inventory provider, which package enrich/provider chooses (provider
// "file": package inventory; provider "openstack": package
// enrich/provider/openstack, whose own loop — cold start, reconcile every
// inventory.refresh — Run runs alongside)
// and swaps in a new snapshot when the inventory changes; an inventory that
// does not load keeps the last good snapshot and is reported once, and one
// that lost more than inventory.max_drop_fraction of the ports is held back
// until consecutive reads or the operator confirm it (inventory.DropGuard;
// provider "nats" snapshots were guarded by the service). The
// Engine is a pipeline.Transform: Apply attributes a batch in place.
//
// Records whose VM-side MAC is not known yet are held in a bounded
// late-binding buffer and released — attributed, zone included — into a
// later batch when a new snapshot knows the MAC; records still unknown after
// the window, or pushed out by a full buffer, are released as tenant
// unknown, zone miss. Records are never dropped. Flush returns what is still
// held, for shutdown.
//
// Rules: docs/attribution.md. Inventory
// format: docs/inventory.md.
package enrich
