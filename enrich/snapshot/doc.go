// Package snapshot is the attribution snapshot: an immutable index built from
// an inventory, and the rules that attribute one record against it.
//
// Build turns an inventory.Inventory into a *Snapshot: the VM-like MAC →
// endpoint index (allowed-address-pair MACs included, amphora data ports
// re-attributed to their load balancer's owner), per-tenant and global
// longest-prefix tables for IPv4 and IPv6, the router-interface MAC →
// external network map, and the per-port external-network fallback. Objects
// that make no sense are skipped or resolved by a documented safe rule and
// reported as Anomaly values; Build never fails.
//
// Snapshot.Attribute is the hot path: it reads only, takes a parsed Input
// and fills a Result without allocating, and is safe for concurrent use.
// AttributeFlow is the convenience form over a textual schemas.Flow.
//
// The rules are those of the domain reference §1–§2 with the changes listed
// in docs/attribution.md.
package snapshot
