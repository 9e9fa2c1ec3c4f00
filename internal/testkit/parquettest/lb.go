package parquettest

import (
	"fmt"
	"time"

	"github.com/tapflow/tapflow/schemas"
)

// LBSegment is one load balancer's segment (lb_segment 0: other traffic
// of the amphora's data ports).
type LBSegment struct {
	LB      string
	Segment int32
}

// LBTraffic is load-balancer traffic as the taps record it, and what each
// load balancer carried with every transfer counted once.
type LBTraffic struct {
	// Flows: segment 1 at the amphora's tap (and an internal client's
	// own tap, without lb_id), segment 2 at both the amphora's and the
	// member's tap (the same bytes twice), other amphora traffic, and
	// plain traffic of the members.
	Flows []schemas.Flow
	// Once is the bytes per load balancer and segment, summed over the
	// transfers generated (never over records): the figure per-LB totals
	// must give.
	Once map[LBSegment]int64
	// Twice is what summing every record with lb_id gives (segment 2 at
	// both taps): what per-LB totals gave before lb_tap.
	Twice map[LBSegment]int64
}

// LBFlows generates LBTraffic for two load balancers of two tenants with
// two members each, transfers seconds apart from start (all in start's
// hour when start is on the hour).
func LBFlows(start time.Time) LBTraffic {
	tr := LBTraffic{Once: map[LBSegment]int64{}, Twice: map[LBSegment]int64{}}
	seq := map[string]int32{}
	at := start.UnixMicro()
	rec := func(node, ifname, dir, tenant, zone, lb string, seg int32, tap string, bytes int64) {
		at += 1_000_000
		seq[node]++
		f := schemas.Flow{
			TimeStart: at - 500_000, TimeEnd: at, Node: node, Ifname: ifname, Direction: dir,
			VMMAC: "fa:16:3e:00:00:01", PeerMAC: "fa:16:3e:00:00:02", IPVersion: 4, Protocol: 6,
			SrcIP: "10.0.0.1", DstIP: "10.0.0.2", SrcPort: 40000, DstPort: 80, TCPFlags: 0x18,
			Packets: bytes/1000 + 1, Bytes: bytes, EndReason: "fin", TenantID: tenant, Zone: zone,
			ExternalNetwork: schemas.NoExternalNetwork, LBID: lb, LBSegment: seg, LBTap: tap,
			AgentID: "agent-" + node, BatchSeq: 1, RecordIndex: seq[node], MetadataVersion: 1,
		}
		if seg == 2 {
			f.PoolID, f.MemberID = lb+"-pool", lb+"-member-"+ifname
		}
		tr.Flows = append(tr.Flows, f)
		if lb != "" {
			tr.Twice[LBSegment{lb, seg}] += bytes
		}
	}
	once := func(lb string, seg int32, bytes int64) { tr.Once[LBSegment{lb, seg}] += bytes }
	for i, lb := range []struct{ id, owner, amp, memberTenant string }{
		{"lb-a", "t1", "tap-amp-a", "t1"},
		{"lb-b", "t2", "tap-amp-b", "t3"}, // members of another project
	} {
		for k := range 3 {
			b := int64(1000*(i+1) + 100*k)
			// segment 1, an external client: the amphora's tap only
			rec("cmp1", lb.amp, "rx", lb.owner, "external", lb.id, 1, schemas.LBTapAmphora, b)
			rec("cmp1", lb.amp, "tx", lb.owner, "external", lb.id, 1, schemas.LBTapAmphora, 10*b)
			once(lb.id, 1, 11*b)
			// segment 1, an internal client: its own tap has no lb_id
			rec("cmp3", "tap-client", "tx", "t9", "other_tenant", "", 1, "", b+7)
			rec("cmp1", lb.amp, "rx", lb.owner, "other_tenant", lb.id, 1, schemas.LBTapAmphora, b+7)
			once(lb.id, 1, b+7)
			for m := range 2 {
				member := fmt.Sprintf("tap-m%d-%s", m, lb.id)
				req, resp := b+int64(m)+3, 9*b+int64(m)
				// segment 2: the request and the response, each at both taps
				rec("cmp1", lb.amp, "tx", lb.owner, "infra", lb.id, 2, schemas.LBTapAmphora, req)
				rec("cmp2", member, "rx", lb.memberTenant, "infra", lb.id, 2, schemas.LBTapMember, req)
				rec("cmp2", member, "tx", lb.memberTenant, "infra", lb.id, 2, schemas.LBTapMember, resp)
				rec("cmp1", lb.amp, "rx", lb.owner, "infra", lb.id, 2, schemas.LBTapAmphora, resp)
				once(lb.id, 2, req+resp)
				// the member's own traffic is no load balancer's
				rec("cmp2", member, "tx", lb.memberTenant, "external", "", 0, "", 5*b)
			}
		}
		// the amphora's data port resolving a name: lb_id, no segment
		rec("cmp1", lb.amp, "tx", lb.owner, "infra", lb.id, 0, schemas.LBTapAmphora, 80)
		once(lb.id, 0, 80)
	}
	return tr
}
