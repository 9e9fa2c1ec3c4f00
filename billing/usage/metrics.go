package usage

import "github.com/prometheus/client_golang/prometheus"

// metrics exist at 0 from the start (the publisher registers them all).
type metrics struct {
	published, held, corrections    prometheus.Counter
	publishErrors, correctorErrors  prometheus.Counter
	passes, passErrors              prometheus.Counter
	delivered, deliveryErrors       prometheus.Counter
	undelivered                     prometheus.Gauge
	heldNow, lag, lastPublishedHour prometheus.Gauge
}

func newMetrics() *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	return &metrics{
		published:       c("tapflow_billing_hours_published_total", "Closed hours published for the first time (revision 0), audit passed."),
		held:            c("tapflow_billing_hours_held_back_total", "Times a closed hour was held back (not published) because its conservation audit failed or it has no meters; retried at every pass."),
		corrections:     c("tapflow_billing_corrections_published_total", "Corrections published: revisions ≥ 1 of an hour whose totals changed after it was published (a late file)."),
		publishErrors:   c("tapflow_billing_publish_errors_total", "Remote writes that failed (the hour is retried at the next pass)."),
		correctorErrors: c("tapflow_billing_corrector_errors_total", "Corrections the rating side (CloudKitty reprocess) did not take; retried at every pass."),
		passes:          c("tapflow_billing_passes_total", "Passes over the closed hours."),
		passErrors:      c("tapflow_billing_pass_errors_total", "Passes that stopped on an error reading the data or the state (the hours not reached are retried at the next pass)."),
		heldNow:         g("tapflow_billing_hours_held_back", "Closed hours currently held back by a failed audit (inside billing.lookback)."),
		lag:             g("tapflow_billing_publish_lag_seconds", "Seconds from the end of the last hour published for the first time to its publication."),
		delivered: c("tapflow_billing_deliveries_total",
			"Published revisions of an hour handed to the delivery (tenant flow logs, billing.flow_logs) and delivered; 0 without billing.flow_logs.location."),
		deliveryErrors: c("tapflow_billing_delivery_errors_total",
			"Deliveries (tenant flow logs) of a published hour that failed; the hour is delivered again at the next pass."),
		undelivered: g("tapflow_billing_flowlogs_pending_hours",
			"Published hours (inside billing.lookback) whose current data is not delivered yet (tenant flow logs): a failed delivery waiting for the next pass."),
		lastPublishedHour: g("tapflow_billing_last_published_hour_timestamp_seconds",
			"End of the newest hour published (Unix seconds); 0 before the first."),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.held, m.corrections, m.publishErrors, m.correctorErrors, m.passes, m.passErrors,
		m.heldNow, m.lag, m.lastPublishedHour, m.delivered, m.deliveryErrors, m.undelivered}
}
