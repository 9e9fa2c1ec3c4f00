package snapshot

import (
	"reflect"
	"testing"
	"time"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
)

// TestInputsBuildAlike: a snapshot built from Inputs (what the engine
// keeps for rebuilds) attributes exactly as one built from the whole
// inventory, on the realistic cloud and on the attribution fixture.
func TestInputsBuildAlike(t *testing.T) {
	o := synth.Realistic
	o.Tenants, o.WithIPv6 = 200, true
	fixture, err := inventory.Load("testdata/cloud.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, inv := range map[string]*inventory.Inventory{"realistic": synth.Generate(o), "testdata/cloud.yaml": fixture} {
		for _, trim := range []bool{false, true} {
			now := time.Now()
			whole := Build(inv, Options{Version: 1, Now: now})
			in := Inputs(inv, trim)
			part := Build(in, Options{Version: 1, Now: now})
			if why := part.Changed(whole, now.UnixMicro()); why != "" {
				t.Errorf("%s (trim %v): %s", name, trim, why)
			}
			if !reflect.DeepEqual(part.Anomalies(), whole.Anomalies()) || part.Stats() != whole.Stats() {
				t.Errorf("%s (trim %v): anomalies or stats differ", name, trim)
			}
			if in.Servers != nil || in.Projects != nil || (trim && len(inv.FloatingIPs) > 0 && in.FloatingIPs[0].ID != "") {
				t.Errorf("%s (trim %v): not trimmed", name, trim)
			}
		}
	}
}
