package enrich

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/schemas"
)

type metrics struct {
	records        [len(zoneIndex)]prometheus.Counter
	badRecords     prometheus.Counter
	held           prometheus.Gauge
	resolved       prometheus.Counter
	released       *prometheus.CounterVec // unresolved late-binding releases by reason
	version        prometheus.Gauge
	builtAt        prometheus.Gauge
	reloads        *prometheus.CounterVec
	anomalies      *prometheus.CounterVec
	snapAnomalies  *prometheus.GaugeVec
	endpoints      prometheus.Gauge
	ghosts         prometheus.Gauge
	amphoraMACs    prometheus.Gauge
	routerMACs     prometheus.Gauge
	buildSeconds   prometheus.Gauge
	recordsByZone  *prometheus.CounterVec
	releasedWindow prometheus.Counter
	releasedFull   prometheus.Counter
	releasedFlush  prometheus.Counter
	invHeld        prometheus.Gauge
	heldTotal      prometheus.Counter
	confirmed      *prometheus.CounterVec
	barriers       *prometheus.CounterVec
	barrierSeconds prometheus.Histogram
}

var zoneIndex = [...]schemas.Zone{schemas.ZoneExternal, schemas.ZoneSameTenant, schemas.ZoneOtherTenant, schemas.ZoneInfra, schemas.ZoneMiss, schemas.ZoneShared, schemas.ZoneMulticast}

// anomalyClasses are the values of tapflow_attribution_anomalies_total{class}.
var anomalyClasses = []string{snapshot.AnomalyInvalidMAC, snapshot.AnomalyInvalidCIDR, snapshot.AnomalyInvalidIP,
	snapshot.AnomalyUnknownNetwork, snapshot.AnomalyMissingProject, snapshot.AnomalyDuplicateMAC, snapshot.AnomalyDuplicateRouterMAC,
	snapshot.AnomalyCycle, snapshot.AnomalyAmbiguity, snapshot.AnomalyMaxHops, snapshot.AnomalyDanglingRoute,
	snapshot.AnomalyMultiExternalPath, snapshot.AnomalyOctaviaSkipped, snapshot.AnomalyTrunkSkipped}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	guard := inventory.NewGuardMetrics()
	m := &metrics{
		recordsByZone: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_enrich_records_total", Help: "Records attributed, by zone."}, []string{"zone"}),
		badRecords:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_enrich_bad_records_total", Help: "Records whose direction, MACs or IPs did not parse (attributed from what parsed)."}),
		held:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_late_binding_held", Help: "Records held waiting for their VM MAC to become known."}),
		resolved:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_enrich_late_binding_resolved_total", Help: "Held records attributed after their VM MAC became known."}),
		released:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_enrich_late_binding_unresolved_total", Help: "Held records released as tenant unknown, zone miss, by reason (window, full, flush)."}, []string{"reason"}),
		version:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_version", Help: "Version (metadata_version) of the attribution snapshot in use."}),
		builtAt:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_timestamp_seconds", Help: "When the snapshot in use was built (Unix time); age = time() - this."}),
		reloads:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_enrich_reloads_total", Help: "Inventory loads, by result (ok, error)."}, []string{"result"}),
		anomalies:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_attribution_anomalies_total", Help: "Inventory objects skipped or resolved by a safe rule, counted once per object, by class."}, []string{"class"}),
		snapAnomalies: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_anomalies", Help: "Anomalies in the snapshot in use, by class."}, []string{"class"}),
		endpoints:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_endpoints", Help: "VM-like MACs in the snapshot in use (ghosts excluded)."}),
		ghosts:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_ghosts", Help: "MACs of deleted ports still attributing (grace window)."}),
		amphoraMACs:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_amphora_macs", Help: "Amphora data port MACs billed to a load balancer owner; 0 while LBs exist means the join stopped resolving."}),
		routerMACs:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_router_macs", Help: "Gatewayed router interface MACs carrying an exit label."}),
		buildSeconds:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_enrich_snapshot_build_seconds", Help: "Time the last snapshot build took."}),
		barriers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_enrich_swap_barriers_total",
			Help: "Snapshot swaps by swap-barrier result: ok (live flows exported and attributed against the old snapshot first), skipped (pure addition), timeout and error (swapped anyway)."}, []string{"result"}),
		barrierSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tapflow_enrich_swap_barrier_seconds",
			Help: "Time from asking for the export of live flows to the swap.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 9)}),
		invHeld:   guard.Held,
		heldTotal: guard.HeldTotal,
		confirmed: guard.Confirmed,
	}
	for _, c := range []prometheus.Collector{m.recordsByZone, m.badRecords, m.held, m.resolved, m.released, m.version, m.builtAt, m.reloads, m.anomalies, m.snapAnomalies, m.endpoints, m.ghosts, m.amphoraMACs, m.routerMACs, m.buildSeconds, m.invHeld, m.heldTotal, m.confirmed, m.barriers, m.barrierSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for i, z := range zoneIndex {
		m.records[i] = m.recordsByZone.WithLabelValues(z.String())
	}
	m.releasedWindow = m.released.WithLabelValues("window")
	m.releasedFull = m.released.WithLabelValues("full")
	m.releasedFlush = m.released.WithLabelValues("flush")
	for _, r := range []string{"ok", "error"} {
		m.reloads.WithLabelValues(r)
	}
	for _, r := range barrierResults {
		m.barriers.WithLabelValues(r)
	}
	// Every class exists at 0, so increase() sees the first anomaly.
	for _, c := range anomalyClasses {
		m.anomalies.WithLabelValues(c)
	}
	return m, nil
}
