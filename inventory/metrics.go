package inventory

import "github.com/prometheus/client_golang/prometheus"

// GuardMetrics are the drop guard's series, the same in the agent (enrich)
// and in `tapflow inventory serve`: defined once here so the two cannot
// drift. The caller registers Collectors().
type GuardMetrics struct {
	// Held is tapflow_inventory_held: 1 while an inventory is held back.
	Held prometheus.Gauge
	// HeldTotal is tapflow_inventory_held_total.
	HeldTotal prometheus.Counter
	// Confirmed is tapflow_inventory_drop_confirmed_total{by}: reads or
	// operator (both exist at 0).
	Confirmed *prometheus.CounterVec
}

// NewGuardMetrics returns the drop-guard series, at 0.
func NewGuardMetrics() *GuardMetrics {
	m := &GuardMetrics{
		Held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_held",
			Help: "1 while an inventory that lost more than inventory.max_drop_fraction of the ports is held back (the previous one stays in use)."}),
		HeldTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_inventory_held_total",
			Help: "Inventories held back for losing more than inventory.max_drop_fraction of the ports."}),
		Confirmed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_drop_confirmed_total",
			Help: "Held inventories applied, by what confirmed them (reads, operator)."}, []string{"by"}),
	}
	for _, b := range []string{"reads", "operator"} {
		m.Confirmed.WithLabelValues(b)
	}
	return m
}

// Collectors returns the series to register.
func (m *GuardMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Held, m.HeldTotal, m.Confirmed}
}

// AgeGauge is tapflow_inventory_age_seconds, read from age on each
// scrape: the openstack provider (since its last complete pass) and the
// nats provider (the service's fetch time of the snapshot held) define it
// alike; -1 before the first.
func AgeGauge(age func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tapflow_inventory_age_seconds",
		Help: "Seconds since the inventory in use was fetched from the cloud completely (provider nats: by the service); -1 before the first."}, age)
}
