package transport

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// ConnectedGauge is tapflow_nats_connected: 1 while nc is connected, 0
// while it reconnects or is closed (the NATS-disconnected alert).
func ConnectedGauge(nc *nats.Conn) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tapflow_nats_connected",
		Help: "1 while the process's NATS connection is up, 0 while it reconnects (batches go to the spool meanwhile).",
	}, func() float64 {
		if nc.IsConnected() {
			return 1
		}
		return 0
	})
}

// ConnMetrics counts what the server refuses on an established connection.
type ConnMetrics struct {
	// PermissionViolations is tapflow_nats_permission_violations_total:
	// publishes or subscribes the server refused for this user's
	// permissions (the message never reached a stream).
	PermissionViolations prometheus.Counter
}

// NewConnMetrics returns the counters, at 0, registered on reg (nil:
// not registered).
func NewConnMetrics(reg prometheus.Registerer) (*ConnMetrics, error) {
	m := &ConnMetrics{PermissionViolations: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tapflow_nats_permission_violations_total",
		Help: "Publishes and subscribes the NATS server refused for this user's permissions (docs/security.md).",
	})}
	if reg != nil {
		if err := reg.Register(m.PermissionViolations); err != nil {
			return nil, fmt.Errorf("nats connection metrics: %w", err)
		}
	}
	return m, nil
}

func (m *ConnMetrics) permissionViolation() {
	if m != nil {
		m.PermissionViolations.Inc()
	}
}
