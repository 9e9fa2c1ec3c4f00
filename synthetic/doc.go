// Package synthetic is the `source: synthetic` of the pipeline: a seeded,
// deterministic generator of flow.v1 records over a generated OpenStack
// cloud, so the whole pipeline runs and is benchmarked without root or a
// cloud.
//
// The cloud is inventory/synth's: tenants with a router and two
// private networks, VMs (VM 0 of each tenant with a floating IP), a shared
// network, external networks the routers are spread over, and
// ACTIVE_STANDBY Octavia load balancers with their amphorae. Inventory
// returns it, and Provider serves it to the enrich stage
// (enrich.WithProvider), which attributes the records exactly as it would
// real capture.
//
// Records are raw capture records, as the ebpf source emits them: node,
// tap device ("tap" + the first 11 characters of the port id), direction,
// VM-side and peer MACs after the directional swap, addresses and ports as
// on the wire (ICMP type and code in the ports), protocol, TCP flags,
// packets, bytes, times and end reason; the attribution columns are empty.
// With Config.Attributed the generator also stamps the attribution it
// expects (tenant, zone, peer tenant, external network, load balancer,
// segment, metadata_version 1), so benchmarks can skip enrich and a test
// checks that enrich reproduces it for every record.
//
// Traffic is a weighted mix of classes (Config.ZoneMix): same_tenant (L2
// and routed between the tenant's subnets), other_tenant (L2), shared,
// external (through the router or an unknown next hop, outbound and
// inbound to floating IPs), infra (metadata, DHCP/DNS to the DHCP port,
// the gateway), multicast (sent, and received: tenant from the tap), miss (taps
// of ports missing from the inventory), lb_segment_1 (client ↔ VIP, at the
// amphora and at the client) and lb_segment_2 (amphora ↔ member).
//
// The stream is a table of flows_per_second active flows visited round
// robin, one record per visit; a flow ends after records_per_second /
// flows_per_second records on average (fin, rst or idle_timeout; earlier
// records active_timeout) and a new one takes its slot. It depends only on
// the seed and the config, never on timing: the clock (Options.Now) only
// fills time_start and time_end, and records_per_second only paces it.
package synthetic
