package transport

import "github.com/prometheus/client_golang/prometheus"

// ConnMetrics counts what the server refuses on an established connection.
type ConnMetrics struct {
	// PermissionViolations is tapflow_nats_permission_violations_total:
	// publishes or subscribes the server refused for this user's
	// permissions (the message never reached a stream).
	PermissionViolations prometheus.Counter
}

// NewConnMetrics returns the counters, at 0.
func NewConnMetrics() *ConnMetrics {
	return &ConnMetrics{PermissionViolations: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tapflow_nats_permission_violations_total",
		Help: "Publishes and subscribes the NATS server refused for this user's permissions (docs/security.md).",
	})}
}

// Collectors returns the metrics to register.
func (m *ConnMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.PermissionViolations}
}

func (m *ConnMetrics) permissionViolation() {
	if m != nil {
		m.PermissionViolations.Inc()
	}
}
