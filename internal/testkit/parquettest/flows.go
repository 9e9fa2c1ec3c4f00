// Package parquettest generates realistic, deterministic flow.v1 records for
// the tests and benchmarks of the Parquet sink, the JSON-lines baseline and
// the report: about 100 tenants, the 7 zones, ~4000 servers with ~5000 ports
// on 200 nodes, 10% IPv6 peers, 5 external networks and 200 load balancers,
// with time_end spread over a window so records fall into several hourly
// partitions.
package parquettest

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/tapflow/tapflow/schemas"
)

// Spec shapes a generated data set. The zero value of a field takes the
// default named on it.
type Spec struct {
	Records int           // number of records (default 1000)
	Seed    uint64        // PRNG seed (default 1)
	Start   time.Time     // time_end of the first record (default 2026-11-29T10:40:00Z)
	Span    time.Duration // time_end of the last record is Start+Span (default 2h)
	Tenants int           // default 100
	Ports   int           // VM ports (default 5000)
	Nodes   int           // compute nodes (default 200)
}

func (s Spec) withDefaults() Spec {
	if s.Records == 0 {
		s.Records = 1000
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	if s.Start.IsZero() {
		s.Start = time.Date(2026, 11, 29, 10, 40, 0, 0, time.UTC)
	}
	if s.Span == 0 {
		s.Span = 2 * time.Hour
	}
	if s.Tenants == 0 {
		s.Tenants = 100
	}
	if s.Ports == 0 {
		s.Ports = 5000
	}
	if s.Nodes == 0 {
		s.Nodes = 200
	}
	return s
}

// Zones are the seven flow.v1 zones, most frequent first.
var Zones = []string{"external", "same_tenant", "other_tenant", "infra", "shared", "multicast", "miss"}

var zoneWeights = []int{40, 25, 10, 10, 8, 4, 3}

var endReasons = []string{"active_timeout", "idle_timeout", "fin", "rst", "overflow", "shutdown"}

type port struct {
	tenant, server, port, mac, node, ifname, ip4, ip6 string
}

// Flows returns spec.Records records ordered by time_end (with jitter
// inside a few seconds, as batches from several agents interleave).
func Flows(spec Spec) []schemas.Flow {
	s := spec.withDefaults()
	r := rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15))
	uuid := func() string {
		return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff,
			0x8000|r.Uint32()&0x3fff, r.Uint64()&0xffffffffffff)
	}
	tenants := make([]string, s.Tenants)
	for i := range tenants {
		tenants[i] = uuid()
	}
	nodes := make([]string, s.Nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("compute-%03d", i)
	}
	extnets := []string{"public", "public-v6", "provider-a", "provider-b", "internet2"}
	lbs := make([]string, 200)
	for i := range lbs {
		lbs[i] = uuid()
	}
	ports := make([]port, s.Ports)
	server := ""
	for i := range ports {
		if i%5 != 1 || server == "" { // ~4 servers per 5 ports
			server = uuid()
		}
		ports[i] = port{
			tenant: tenants[r.IntN(len(tenants))],
			server: server,
			port:   uuid(),
			mac:    fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", byte(i>>16), byte(i>>8), byte(i)),
			node:   nodes[r.IntN(len(nodes))],
			ifname: fmt.Sprintf("tap%08x-%02x", r.Uint32(), r.Uint32()&0xff),
			ip4:    fmt.Sprintf("10.%d.%d.%d", byte(i>>16)+byte(r.IntN(4)), byte(i>>8), byte(i)|1),
			ip6:    fmt.Sprintf("2001:db8:%x::%x", i>>8, i&0xff+1),
		}
	}
	totalW := 0
	for _, w := range zoneWeights {
		totalW += w
	}
	pickZone := func() string {
		n := r.IntN(totalW)
		for i, w := range zoneWeights {
			if n < w {
				return Zones[i]
			}
			n -= w
		}
		return Zones[0]
	}
	out := make([]schemas.Flow, s.Records)
	startUS := s.Start.UnixMicro()
	spanUS := s.Span.Microseconds()
	var seq int64
	for i := range out {
		p := &ports[r.IntN(len(ports))]
		peer := &ports[r.IntN(len(ports))]
		zone := pickZone()
		dir := "tx"
		if r.IntN(2) == 0 {
			dir = "rx"
		}
		end := startUS
		if s.Records > 1 {
			end += spanUS * int64(i) / int64(s.Records-1)
		}
		end -= r.Int64N(2_000_000) // up to 2 s out of order
		if end < startUS {
			end = startUS
		}
		dur := r.Int64N(30_000_000)
		f := schemas.Flow{
			TimeStart: end - dur, TimeEnd: end,
			Node: p.node, Ifname: p.ifname, Direction: dir,
			VMMAC: p.mac, PeerMAC: peer.mac,
			IPVersion: 4, Protocol: []int32{6, 6, 6, 17, 17, 1}[r.IntN(6)],
			SrcIP: p.ip4, DstIP: peer.ip4,
			SrcPort: int32(32768 + r.IntN(28000)), DstPort: []int32{443, 80, 53, 22, 5432, 8080, 6443}[r.IntN(7)],
			Packets:   1 + r.Int64N(2000),
			EndReason: endReasons[r.IntN(len(endReasons))],
			TenantID:  p.tenant, ServerID: p.server, PortID: p.port,
			Zone: zone, ExternalNetwork: "none",
			AgentID: "agent-" + p.node, BatchSeq: seq, RecordIndex: int32(i % 4096),
			MetadataVersion: 7,
		}
		if i%4096 == 4095 {
			seq++
		}
		f.Bytes = f.Packets * (64 + r.Int64N(1400))
		if f.Protocol == 6 {
			f.TCPFlags = int32(0x18 | r.IntN(8))
		}
		if f.Protocol == 1 {
			f.SrcPort, f.DstPort = 8, 0
		}
		if r.IntN(10) == 0 {
			f.IPVersion, f.SrcIP, f.DstIP = 6, p.ip6, peer.ip6
		}
		if r.IntN(20) == 0 {
			f.VLANID = int32(100 + r.IntN(10))
		}
		switch zone {
		case "external":
			f.ExternalNetwork = extnets[r.IntN(len(extnets))]
			f.DstIP = fmt.Sprintf("%d.%d.%d.%d", 1+r.IntN(223), r.IntN(256), r.IntN(256), 1+r.IntN(254))
			f.PeerMAC = "fa:16:3e:00:00:01"
		case "same_tenant":
			f.PeerTenantID = p.tenant
		case "other_tenant":
			f.PeerTenantID = peer.tenant
		case "multicast":
			f.PeerMAC, f.DstIP, f.Protocol, f.DstPort = "ff:ff:ff:ff:ff:ff", "255.255.255.255", 17, 67
		case "miss":
			f.TenantID, f.ServerID, f.PortID = "unknown", "", ""
		}
		if r.IntN(20) == 0 {
			f.LBID = lbs[r.IntN(len(lbs))]
			f.LBSegment = int32(1 + r.IntN(2))
			f.LBTap = schemas.LBTapAmphora
			if f.LBSegment == 2 { // per-member columns (flow.v1.1), without another random draw
				f.PoolID = f.LBID + "-pool"
				f.MemberID = fmt.Sprintf("%s-member-%d", f.LBID, i%3)
				if i%2 == 1 { // a member's copy (flow.v1.2 lb_tap)
					f.LBTap = schemas.LBTapMember
				}
			}
		}
		if dir == "rx" {
			f.SrcIP, f.DstIP = f.DstIP, f.SrcIP
			f.SrcPort, f.DstPort = f.DstPort, f.SrcPort
		}
		out[i] = f
	}
	return out
}
