// Package natsinv carries inventory snapshots over NATS JetStream: the
// wire format, the publisher that `tapflow inventory serve` writes with,
// the lease that lets only one of several serve instances read the cloud
// and publish, and the agent's provider (inventory.provider: nats), which
// needs NATS credentials only.
//
// A snapshot is one object, "snapshot", in the Object Store bucket
// TAPFLOW_INVENTORY: the inventory gob-encoded, then zstd-compressed
// (100,500 ports, 10,000 routers, 50,000 floating IPs: about 1 MB; the
// Object Store chunks it, where a KV value is capped at the server's
// max_payload, 1 MiB by default). Its headers carry the version (a
// sequence, +1 per publish), when the service fetched it, and a digest of
// the encoded inventory, so an unchanged cloud is not published again.
// Each put replaces the previous object: the bucket holds one snapshot.
// The names on the bus (bucket, lease bucket, delta and "still current"
// subjects) are transport's (transport/inventory.go), beside the record
// subjects; the NATS permissions (transport/roles) name the same.
//
// The provider cold-starts from the local copy it keeps (0600, written
// atomically) or from the store, watches the bucket, and keeps the last
// good snapshot through a service or NATS outage, a snapshot that does not
// decode and an out-of-order version, logging each and counting it in
// tapflow_inventory_updates_total{result}. docs/inventory-service.md.
package natsinv
