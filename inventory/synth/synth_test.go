package synth_test

import (
	"testing"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory/synth"
)

func TestGenerateIsClean(t *testing.T) {
	for _, o := range []synth.Options{{Tenants: 3, VMsPerTenant: 4, LoadBalancers: 1}, synth.Realistic} {
		o.WithIPv6 = true
		s := snapshot.Build(synth.Generate(o), snapshot.Options{Version: 1})
		if a := s.Anomalies(); len(a) != 0 {
			t.Fatalf("%+v: anomalies %v", o, a[:min(5, len(a))])
		}
		st := s.Stats()
		if st.Endpoints != o.Tenants*o.VMsPerTenant+5*o.LoadBalancers /* VIP port, 2 management, 2 data */ || st.AmphoraMACs != 2*o.LoadBalancers {
			t.Errorf("%+v: stats %+v", o, st)
		}
	}
}

func TestWithUUIDsKeepsTheCloudIntact(t *testing.T) {
	o := synth.Options{Tenants: 20, VMsPerTenant: 4, LoadBalancers: 3, FloatingIPsPerTenant: 2}
	want := snapshot.Build(synth.Generate(o), snapshot.Options{Version: 1}).Stats()
	inv := synth.WithUUIDs(synth.Generate(o))
	if id := inv.Ports[0].ID; len(id) != 36 || id[8] != '-' {
		t.Fatalf("port id %q", id)
	}
	s := snapshot.Build(inv, snapshot.Options{Version: 1})
	if a := s.Anomalies(); len(a) != 0 {
		t.Fatalf("anomalies %v", a[:min(5, len(a))])
	}
	if got := s.Stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
	if len(inv.FloatingIPs) != 20*2 {
		t.Errorf("floating IPs %d", len(inv.FloatingIPs))
	}
}
