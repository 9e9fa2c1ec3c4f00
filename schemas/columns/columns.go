// Package columns is the single source of truth for tapflow's records
// (flow.v1, meter.v1): one table of columns per record from which the Go
// struct (generated into package schemas), the Arrow schema, the Parquet
// schema and docs/schema.md are derived.
//
// Adding a column: append a row to its table (never rename or reorder
// existing rows: readers depend on them) with Since set to the table's
// next minor version, raise the table's Minor, then run `make generate`.
// That is a minor version: additive, recorded in every Parquet file's
// key-value metadata (tapflow.schema_version) and in the Arrow schema, so
// a directory mixing files from before and after reads by column name
// (DuckDB union_by_name, Spark mergeSchema). Renaming, retyping or
// removing a column is a new major version (a new schema name). Adding a
// record type: a new table and a new entry in Tables.
package columns

// Kind is the logical type of a column.
type Kind int

// Column kinds. Every kind maps to exactly one Go, Arrow and Parquet type.
const (
	// Timestamp: Go int64 microseconds since the Unix epoch (UTC); Arrow
	// timestamp[us, tz=UTC]; Parquet INT64 TIMESTAMP(MICROS, isAdjustedToUTC).
	Timestamp Kind = iota
	// String: Go string; Arrow utf8; Parquet BYTE_ARRAY STRING.
	String
	// Int32: Go int32; Arrow int32; Parquet INT32.
	Int32
	// Int64: Go int64; Arrow int64; Parquet INT64 (never unsigned: Spark).
	Int64
)

func (k Kind) String() string {
	switch k {
	case Timestamp:
		return "timestamp"
	case String:
		return "string"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	}
	return "invalid"
}

// Column describes one column of a record schema.
type Column struct {
	Name   string // column name in Arrow, Parquet and SQL
	GoName string // field name of the generated Go struct
	Kind   Kind
	// Dict marks a string whose values repeat: Parquet dictionary-encodes
	// it and the wire sends a dictionary (but Addr columns).
	Dict bool
	// Addr marks an IP address as text: its Arrow type is utf8, and an
	// agent sends it as a dictionary in a message whose addresses repeat
	// (schemas' ipColumn).
	Addr bool
	// Delta marks a slowly-increasing integer (times, sequences): Parquet
	// uses DELTA_BINARY_PACKED, measured ~20% faster and smaller than plain.
	Delta bool
	Doc   string
	// Unit of a number (bytes, packets, µs…); timestamps need none.
	// docs/schema.md shows it.
	Unit string
	// Empty says when the value is empty ('', 0, a sentinel) and what
	// that means; blank: always set. docs/schema.md shows it.
	Empty string
	// Since is the minor version of the table that added the column; 0:
	// there from the start. Readers fill a column newer than the writer
	// with its zero value.
	Since int
}

// SchemaName is the value of the tapflow.schema key in Parquet key-value
// metadata and Arrow schema metadata of flow records.
const SchemaName = "flow.v1"

// MeterSchemaName is the tapflow.schema value of meter records.
const MeterSchemaName = "meter.v1"

// Table is one record type: its schema name, the generated Go type and
// file, and its columns.
type Table struct {
	Name    string // schema name: flow.v1
	Doc     string // what one record is (docs/schema.md)
	Type    string // Go type in package schemas: Flow
	File    string // generated file in package schemas: flow_gen.go
	Minor   int    // minor version: the largest Since of its columns
	Columns []Column
}

// FlowMinor is flow.v1's minor version (flow.v1.1: pool_id, member_id;
// flow.v1.2: lb_tap).
const FlowMinor = 2

// MeterMinor is meter.v1's minor version.
const MeterMinor = 0

// Tables lists every record type the generator renders.
var Tables = []Table{
	{Name: SchemaName, Type: "Flow", File: "flow_gen.go", Minor: FlowMinor, Columns: FlowV1,
		Doc: "One flow.v1 record is what one tap saw of one flow (5-tuple, VLAN, direction) between time_start and time_end, attributed to a tenant and a zone. A long flow yields several records (active_timeout); sum bytes and packets over records, never take one as the whole flow."},
	{Name: MeterSchemaName, Type: "Meter", File: "meter_gen.go", Minor: MeterMinor, Columns: MeterV1,
		Doc: "One meter.v1 record is what the kernel counted on one tap and direction between time_start and time_end. Every counter is the delta since the previous meter record of that tap and direction; Σ flow.v1 bytes (packets) of a tap and direction = Σ meter.v1 bytes (packets) − Σ lost_bytes (lost_packets)."},
}

// FlowV1 is the flow.v1 record, in column order (DESIGN §4).
var FlowV1 = []Column{
	{Name: "time_start", GoName: "TimeStart", Kind: Timestamp, Delta: true, Doc: "first packet covered by this record (µs since epoch, UTC)"},
	{Name: "time_end", GoName: "TimeEnd", Kind: Timestamp, Delta: true, Doc: "last packet covered by this record (µs since epoch, UTC); partitions by this"},
	{Name: "node", GoName: "Node", Kind: String, Dict: true, Doc: "compute host that captured the record"},
	{Name: "ifname", GoName: "Ifname", Kind: String, Dict: true, Doc: "tap device"},
	{Name: "direction", GoName: "Direction", Kind: String, Dict: true, Doc: "tx (VM sends) or rx (VM receives), from the VM's point of view"},
	{Name: "vm_mac", GoName: "VMMAC", Kind: String, Dict: true, Doc: "VM-side MAC after the directional swap"},
	{Name: "peer_mac", GoName: "PeerMAC", Kind: String, Dict: true, Doc: "far-side MAC after the directional swap"},
	{Name: "vlan_id", GoName: "VLANID", Kind: Int32, Doc: "802.1Q VLAN id; 0 when untagged", Empty: "0: untagged"},
	{Name: "ip_version", GoName: "IPVersion", Kind: Int32, Doc: "4 or 6"},
	{Name: "protocol", GoName: "Protocol", Kind: Int32, Doc: "IANA protocol number"},
	{Name: "src_ip", GoName: "SrcIP", Kind: String, Dict: true, Addr: true, Doc: "source address as on the wire"},
	{Name: "dst_ip", GoName: "DstIP", Kind: String, Dict: true, Addr: true, Doc: "destination address as on the wire"},
	{Name: "src_port", GoName: "SrcPort", Kind: Int32, Doc: "source port; 0 when not TCP/UDP/SCTP", Empty: "0: not TCP, UDP or SCTP"},
	{Name: "dst_port", GoName: "DstPort", Kind: Int32, Doc: "destination port; 0 when not TCP/UDP/SCTP", Empty: "0: not TCP, UDP or SCTP"},
	{Name: "tcp_flags", GoName: "TCPFlags", Kind: Int32, Doc: "OR of the TCP flags seen", Unit: "bit mask (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10, URG 0x20, ECE 0x40, CWR 0x80)", Empty: "0: not TCP"},
	{Name: "packets", GoName: "Packets", Kind: Int64, Doc: "packets covered by this record", Unit: "packets"},
	{Name: "bytes", GoName: "Bytes", Kind: Int64, Doc: "bytes (skb->len, L2) covered by this record", Unit: "bytes (L2 frame, skb->len)"},
	{Name: "end_reason", GoName: "EndReason", Kind: String, Dict: true, Doc: "fin, rst, active_timeout, idle_timeout, overflow, shutdown or inventory_change (exported early by the swap barrier before an inventory change; docs/attribution.md)"},
	{Name: "tenant_id", GoName: "TenantID", Kind: String, Dict: true, Doc: "Keystone project UUID owning the VM port (the LB owner for amphorae), or unknown", Empty: "unknown: the VM MAC matches no inventory port (zone miss)"},
	{Name: "server_id", GoName: "ServerID", Kind: String, Dict: true, Doc: "Nova instance UUID; '' when unknown", Empty: "'': the port has no Nova instance (amphora, unknown VM)"},
	{Name: "port_id", GoName: "PortID", Kind: String, Dict: true, Doc: "Neutron port UUID; '' when unknown", Empty: "'': the tap matches no Neutron port"},
	{Name: "zone", GoName: "Zone", Kind: String, Dict: true, Doc: "same_tenant, other_tenant, shared, external, infra, multicast or miss"},
	{Name: "peer_tenant_id", GoName: "PeerTenantID", Kind: String, Dict: true, Doc: "tenant of the far end when known, else ''", Empty: "'': the far end is no known tenant's (external, infra, shared router, unknown)"},
	{Name: "external_network", GoName: "ExternalNetwork", Kind: String, Dict: true, Doc: "external network name (ID when nameless) on external records, else none", Empty: "none: the record is not external"},
	{Name: "lb_id", GoName: "LBID", Kind: String, Dict: true, Doc: "Octavia load balancer when the tap is an amphora's, and on a member's segment-2 records; else ''", Empty: "'': neither an amphora's tap nor a member's segment-2 record"},
	{Name: "lb_segment", GoName: "LBSegment", Kind: Int32, Doc: "1 (client ↔ VIP), 2 (amphora ↔ member), 0 otherwise", Empty: "0: not load-balancer traffic"},
	{Name: "agent_id", GoName: "AgentID", Kind: String, Dict: true, Doc: "agent that produced the record; with batch_seq and record_index the unique record identity"},
	{Name: "batch_seq", GoName: "BatchSeq", Kind: Int64, Delta: true, Doc: "sequence number of the agent batch that carried the record"},
	{Name: "record_index", GoName: "RecordIndex", Kind: Int32, Doc: "index of the record inside its batch"},
	{Name: "metadata_version", GoName: "MetadataVersion", Kind: Int64, Doc: "attribution snapshot version used to attribute the record"},
	// flow.v1.1
	{Name: "pool_id", GoName: "PoolID", Kind: String, Dict: true, Since: 1, Doc: "Octavia pool of the member on segment-2 records (amphora and member taps), else ''", Empty: "'': not a segment-2 record, or written before flow.v1.1"},
	{Name: "member_id", GoName: "MemberID", Kind: String, Dict: true, Since: 1, Doc: "Octavia pool member on segment-2 records (amphora and member taps), else ''", Empty: "'': not a segment-2 record, or written before flow.v1.1"},
	// flow.v1.2
	{Name: "lb_tap", GoName: "LBTap", Kind: String, Dict: true, Since: 2, Doc: "which tap saw a record with lb_id: amphora (the load balancer's amphora) or member (a pool member's copy of segment 2: the bytes the amphora's tap saw, again); per-load-balancer totals sum lb_tap <> 'member' so each byte counts once", Empty: "'': no lb_id, or from an agent before flow.v1.2 (NULL in files before flow.v1.2)"},
}

// MeterV1 is the meter.v1 record: what the kernel counted on one tap and
// direction between time_start and time_end. Every counter is the delta
// since the previous meter record of that tap and direction, so sums over
// any time range are meaningful; Σ flow.v1 bytes (packets) of a tap and
// direction equals Σ meter.v1 bytes (packets) minus lost_bytes
// (lost_packets).
var MeterV1 = []Column{
	{Name: "time_start", GoName: "TimeStart", Kind: Timestamp, Delta: true, Doc: "start of the interval: the agent's previous meter tick, so the previous record's time_end of a tap that was already attached (µs since epoch, UTC)"},
	{Name: "time_end", GoName: "TimeEnd", Kind: Timestamp, Delta: true, Doc: "end of the interval (µs since epoch, UTC); partitions by this"},
	{Name: "node", GoName: "Node", Kind: String, Dict: true, Doc: "compute host that captured the record"},
	{Name: "ifname", GoName: "Ifname", Kind: String, Dict: true, Doc: "tap device"},
	{Name: "direction", GoName: "Direction", Kind: String, Dict: true, Doc: "tx (VM sends) or rx (VM receives), from the VM's point of view"},
	{Name: "packets", GoName: "Packets", Kind: Int64, Doc: "IP packets the program saw in the interval", Unit: "packets"},
	{Name: "bytes", GoName: "Bytes", Kind: Int64, Doc: "bytes (skb->len, L2) of those packets", Unit: "bytes (L2 frame, skb->len)"},
	{Name: "lost_packets", GoName: "LostPackets", Kind: Int64, Doc: "packets counted but not exported (ring buffer full)", Unit: "packets", Empty: "0: nothing lost"},
	{Name: "lost_bytes", GoName: "LostBytes", Kind: Int64, Doc: "bytes counted but not exported (ring buffer full)", Unit: "bytes", Empty: "0: nothing lost"},
	{Name: "failed_updates", GoName: "FailedUpdates", Kind: Int64, Doc: "flow-table updates that failed (the packet went out as an overflow record)", Unit: "flow-table updates", Empty: "0: none failed"},
	{Name: "skipped_non_ip", GoName: "SkippedNonIP", Kind: Int64, Doc: "non-IP frames seen and not counted in packets or bytes", Unit: "frames", Empty: "0: none"},
	{Name: "agent_id", GoName: "AgentID", Kind: String, Dict: true, Doc: "agent that produced the record; with batch_seq and record_index the unique record identity"},
	{Name: "batch_seq", GoName: "BatchSeq", Kind: Int64, Delta: true, Doc: "sequence number of the agent meter batch that carried the record"},
	{Name: "record_index", GoName: "RecordIndex", Kind: Int32, Doc: "index of the record inside its batch"},
}
