package synth_test

import (
	"testing"

	"github.com/tapflow/tapflow/enrich/inventory/synth"
	"github.com/tapflow/tapflow/enrich/snapshot"
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
