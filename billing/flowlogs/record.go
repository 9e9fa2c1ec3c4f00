package flowlogs

import (
	"github.com/tapflow/tapflow/schemas"
)

// Version is the AWS VPC Flow Logs version whose field names Record uses.
const Version = 5

// SchemaName is the file key-value metadata value (schemas.MetadataKey)
// of a delivered file.
const SchemaName = "tapflow.flowlogs.v1"

// Record is one row of a delivered file: the AWS VPC Flow Logs v5 fields
// that have a flow.v1 equivalent, under the names AWS's own Parquet flow
// logs and its Athena tables use ('-' as '_'), then tapflow's own columns
// under their flow.v1 names. docs/billing.md has the mapping.
type Record struct {
	Version     int32  `parquet:"version"`
	AccountID   string `parquet:"account_id,dict"`   // tenant_id
	InterfaceID string `parquet:"interface_id,dict"` // port_id
	SrcAddr     string `parquet:"srcaddr"`           // src_ip (no NAT at a tap)
	DstAddr     string `parquet:"dstaddr"`           // dst_ip
	SrcPort     int32  `parquet:"srcport"`
	DstPort     int32  `parquet:"dstport"`
	Protocol    int32  `parquet:"protocol"`
	Packets     int64  `parquet:"packets"`
	Bytes       int64  `parquet:"bytes"` // L2 frame bytes (skb->len), not IP bytes
	Start       int64  `parquet:"start"` // Unix seconds, floor of time_start
	End         int64  `parquet:"end"`   // Unix seconds, floor of time_end
	LogStatus   string `parquet:"log_status,dict"`
	InstanceID  string `parquet:"instance_id,dict"` // server_id
	TCPFlags    int32  `parquet:"tcp_flags"`
	Type        string `parquet:"type,dict"` // IPv4 / IPv6
	PktSrcAddr  string `parquet:"pkt_srcaddr"`
	PktDstAddr  string `parquet:"pkt_dstaddr"`
	// FlowDirection: egress (tx, the VM sent) or ingress (rx).
	FlowDirection string `parquet:"flow_direction,dict"`
	// TrafficPath: egress only, like AWS: 1 same_tenant, 4 other_tenant,
	// 2 external; null otherwise (zone says more).
	TrafficPath *int32 `parquet:"traffic_path,optional"`

	// tapflow's own columns (flow.v1 names and meanings).
	TimeStart       int64  `parquet:"time_start,timestamp(microsecond),delta"`
	TimeEnd         int64  `parquet:"time_end,timestamp(microsecond),delta"`
	Zone            string `parquet:"zone,dict"`
	ExternalNetwork string `parquet:"external_network,dict"`
	LBID            string `parquet:"lb_id,dict"`
	LBSegment       int32  `parquet:"lb_segment"`
	LBTap           string `parquet:"lb_tap,dict"`
	PoolID          string `parquet:"pool_id,dict"`
	MemberID        string `parquet:"member_id,dict"`
	VMMAC           string `parquet:"vm_mac,dict"`
	VLANID          int32  `parquet:"vlan_id"`
	EndReason       string `parquet:"end_reason,dict"`
}

// trafficPath values (AWS: 1 through another resource in the same VPC,
// 2 through an internet gateway, 4 through intra-region VPC peering).
var (
	pathSameVPC  int32 = 1
	pathInternet int32 = 2
	pathPeering  int32 = 4
)

// toRecord maps one flow.v1 record of f.TenantID's to its delivered row.
// What another project may not see is left out: peer_tenant_id, peer_mac
// and the node, tap and agent that captured it; on a member's copy of
// segment 2 (lb_tap member) of a load balancer another project owns, the
// load balancer, pool and member IDs are blanked.
func toRecord(f *schemas.Flow) Record {
	r := Record{
		Version: Version, AccountID: f.TenantID, InterfaceID: f.PortID,
		SrcAddr: f.SrcIP, DstAddr: f.DstIP, SrcPort: f.SrcPort, DstPort: f.DstPort, Protocol: f.Protocol,
		Packets: f.Packets, Bytes: f.Bytes,
		Start: floorDiv(f.TimeStart, 1e6), End: floorDiv(f.TimeEnd, 1e6),
		LogStatus: "OK", InstanceID: f.ServerID, TCPFlags: f.TCPFlags,
		PktSrcAddr: f.SrcIP, PktDstAddr: f.DstIP,
		TimeStart: f.TimeStart, TimeEnd: f.TimeEnd,
		Zone: f.Zone, ExternalNetwork: f.ExternalNetwork,
		LBID: f.LBID, LBSegment: f.LBSegment, LBTap: f.LBTap, PoolID: f.PoolID, MemberID: f.MemberID,
		VMMAC: f.VMMAC, VLANID: f.VLANID, EndReason: f.EndReason,
	}
	switch f.IPVersion {
	case 4:
		r.Type = "IPv4"
	case 6:
		r.Type = "IPv6"
	}
	switch f.Direction {
	case "tx":
		r.FlowDirection = "egress"
		switch f.Zone {
		case "same_tenant":
			r.TrafficPath = &pathSameVPC
		case "other_tenant":
			r.TrafficPath = &pathPeering
		case "external":
			r.TrafficPath = &pathInternet
		}
	case "rx":
		r.FlowDirection = "ingress"
	}
	if f.LBTap == schemas.LBTapMember && f.PeerTenantID != f.TenantID {
		// the amphora's load balancer is another project's
		r.LBID, r.PoolID, r.MemberID = "", "", ""
	}
	return r
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
