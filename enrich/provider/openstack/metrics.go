package openstack

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/inventory"
)

type metrics struct {
	errors      *prometheus.CounterVec
	passes      *prometheus.CounterVec
	passSeconds prometheus.Gauge
	objects     *prometheus.GaugeVec
	stale       *prometheus.GaugeVec
	skipped     *prometheus.GaugeVec
}

// Endpoints are the endpoint label values of tapflow_inventory_errors_total.
var Endpoints = []string{"keystone", "projects", "networks", "subnets", "ports", "routers", "floatingips", "servers", "loadbalancers", "amphorae", "pools", "members", "trunks"}

// bestEffort lists the collections a pass may serve from the previous
// inventory.
var bestEffort = []string{"servers", "loadbalancers", "amphorae", "pools", "trunks"}

func newMetrics(reg prometheus.Registerer, age func() float64) (*metrics, error) {
	m := &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_errors_total",
			Help: "OpenStack API failures, by collection (keystone, projects, networks, ..., members) and code (HTTP status, network, timeout, decode, catalog)."},
			[]string{"endpoint", "code"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_inventory_passes_total",
			Help: "Inventory passes, by result: ok (complete, possibly with best-effort collections kept from the previous pass) or error (a required collection failed; the last inventory stays)."},
			[]string{"result"}),
		passSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_inventory_pass_seconds",
			Help: "Wall time of the last inventory pass."}),
		objects: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_inventory_objects",
			Help: "Objects in the inventory in use, by collection."}, []string{"collection"}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_inventory_stale",
			Help: "1 when a best-effort collection (servers, loadbalancers, amphorae, pools) failed in the last pass and its previous values are served."},
			[]string{"collection"}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tapflow_inventory_skipped_loadbalancers",
			Help: "Load balancers of a non-amphora provider (not re-attributed), by provider, in the last pass."},
			[]string{"provider"}),
	}
	ageG := inventory.AgeGauge(age)
	for _, c := range []prometheus.Collector{m.errors, m.passes, m.passSeconds, m.objects, m.stale, m.skipped, ageG} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"ok", "error"} {
		m.passes.WithLabelValues(r)
	}
	for _, c := range bestEffort {
		m.stale.WithLabelValues(c)
	}
	return m, nil
}
