// Package billingdata writes a conserved collector output for the billing
// tests: the packets and meter ticks of package metered (flows and meters
// that pass the conservation audit, through the real Parquet sink), with
// every flow record attributed as an OpenStack cloud would: two projects,
// each VM tap belonging to one, and traffic in the zones a bill prices —
// same_tenant, shared, external over two external networks, infra — plus a
// load balancer of project B (amphora records under its lb_id, a member's
// copy of segment 2 in project A). Expected sums the records itself, with
// the billing rules of docs/billing.md, independently of internal/report.
// No product code lives here.
package billingdata

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/testkit/metered"
	"github.com/tapflow/tapflow/schemas"
)

// The two projects (Keystone project IDs) and what else the records name.
const (
	ProjectA  = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
	ProjectB  = "0f9e8d7c6b5a49382716f5e4d3c2b1a0"
	External1 = "public"
	External2 = "transit-isp2"
	LB        = "6c1f0b3e-7a2d-4e59-9c8b-1d2e3f4a5b6c"
)

// Spec shapes the data.
type Spec struct {
	// Start and Span: packets from Start to Start+Span (metered's
	// defaults when zero).
	Start time.Time
	Span  time.Duration
	// Nodes names the compute nodes cmp<First>…; First (default 1) lets a
	// late file come from other agents than the first data.
	Nodes, First int
	// Taps per node (default 2: one VM of each project; 1: project A's only).
	Taps int
	Seed uint64
}

// Generate makes the records: metered's, attributed.
func Generate(s Spec) metered.Data {
	d := metered.Generate(metered.Spec{Start: s.Start, Span: s.Span, Nodes: cmp.Or(s.Nodes, 2), Taps: cmp.Or(s.Taps, 2), Seed: s.Seed,
		MeanGap: 2 * time.Second, MeterInterval: 30 * time.Second})
	first := cmp.Or(s.First, 1)
	for i := range d.Flows {
		f := &d.Flows[i]
		f.Node, f.Ifname = renumber(f.Node, f.Ifname, first)
		attribute(f, i)
	}
	for i := range d.Meters {
		m := &d.Meters[i]
		m.Node, m.Ifname = renumber(m.Node, m.Ifname, first)
	}
	return d
}

// renumber moves node cmpN (tap N00-aa…) to cmp<N+first-1>.
func renumber(node, ifname string, first int) (string, string) {
	var n, t int
	if _, err := fmt.Sscanf(node, "cmp%d", &n); err != nil {
		return node, ifname
	}
	if _, err := fmt.Sscanf(strings.TrimPrefix(ifname, fmt.Sprintf("tap%d", n)), "%02d-aa", &t); err != nil {
		return node, ifname
	}
	n += first - 1
	return fmt.Sprintf("cmp%d", n), fmt.Sprintf("tap%d%02d-aa", n, t)
}

// attribute sets tenant, zone, external network and load balancer: the
// first tap of each node is project A's VM, the second project B's (its
// LB's amphora for a sixth of the records).
func attribute(f *schemas.Flow, i int) {
	b := !strings.HasSuffix(f.Ifname, "00-aa")
	f.TenantID = ProjectA
	if b {
		f.TenantID = ProjectB
	}
	f.ExternalNetwork, f.LBID, f.LBTap, f.LBSegment = "none", "", "", 0
	switch i % 6 {
	case 0:
		f.Zone = "same_tenant"
	case 1:
		f.Zone, f.ExternalNetwork = "external", External1
	case 2:
		f.Zone, f.ExternalNetwork = "external", External2
	case 3:
		f.Zone = "shared"
	case 4:
		f.Zone = "infra"
	case 5:
		if b { // the amphora's tap: segment 1, a client on the internet
			f.Zone, f.ExternalNetwork, f.LBID, f.LBTap, f.LBSegment = "external", External1, LB, "amphora", 1
		} else { // project A's VM is a member: its copy of segment 2
			f.Zone, f.LBID, f.LBTap, f.LBSegment = "infra", LB, "member", 2
		}
	}
}

// Expected sums the records with time_end in [h, h+1h) per billed key:
// the record's project, zone, direction and external network, its lb_id
// unless it is a member's copy (lb_tap member) — docs/billing.md.
func Expected(flows []schemas.Flow, h time.Time) usage.Totals {
	from, to := h.UnixMicro(), h.Add(time.Hour).UnixMicro()
	sums := map[usage.Key]*usage.Total{}
	for _, f := range flows {
		if f.TimeEnd < from || f.TimeEnd >= to {
			continue
		}
		lb := f.LBID
		if lb == "" || f.LBTap == "member" {
			lb = usage.None
		}
		k := usage.Key{Project: f.TenantID, Zone: f.Zone, Direction: f.Direction, ExternalNetwork: cmp.Or(f.ExternalNetwork, usage.None), LB: lb}
		t := sums[k]
		if t == nil {
			t = &usage.Total{Key: k}
			sums[k] = t
		}
		t.Bytes += f.Bytes
		t.Packets += f.Packets
	}
	out := make(usage.Totals, 0, len(sums))
	for _, t := range sums {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b usage.Total) int {
		return cmp.Or(strings.Compare(a.Project, b.Project), strings.Compare(a.Zone, b.Zone), strings.Compare(a.Direction, b.Direction),
			strings.Compare(a.ExternalNetwork, b.ExternalNetwork), strings.Compare(a.LB, b.LB))
	})
	return out
}

// Write writes d under dir as the collector does (metered.Write), leaving
// out the flow records skip names.
func Write(ctx context.Context, dir string, d metered.Data, skip map[int]bool) error {
	return metered.Write(ctx, dir, d, skip)
}
