package openstack

import (
	"testing"
	"time"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory/synth"
)

// BenchmarkSnapshotBuild10kPorts: what follows a pass for a cloud of
// 10,000 VM ports (synth.Realistic: 1,000 tenants, 2,000 subnets, 100
// ACTIVE_STANDBY LBs): the provider's sort and change hash, then the
// engine's snapshot build.
func BenchmarkSnapshotBuild10kPorts(b *testing.B) {
	inv := synth.Generate(synth.Realistic)
	b.Run("sort+hash", func(b *testing.B) {
		for b.Loop() {
			sortInventory(inv)
			if _, err := hashInventory(inv); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(inv.Ports)), "ports")
	})
	b.Run("snapshot.Build", func(b *testing.B) {
		now := time.Now()
		for b.Loop() {
			snapshot.Build(inv, snapshot.Options{Version: 1, Now: now, GhostGrace: time.Minute})
		}
		b.ReportMetric(float64(len(inv.Ports)), "ports")
	})
}
