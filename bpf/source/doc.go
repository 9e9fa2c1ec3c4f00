// Package source is the `source: ebpf` of the pipeline: it runs the kernel
// capture (package bpf/capture) and turns its records into schemas.Flow
// batches — directional swap applied (tx: VM MAC = source MAC; rx: VM MAC
// = destination MAC), MACs and IPs as interned strings so that steady-state
// decoding allocates nothing per record, times in µs UTC.
//
// ICMP and ICMPv6 records carry the type in SrcPort and the code in DstPort.
// Enrichment columns (TenantID … MetadataVersion) are left empty.
package source
