package capture

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tapflow/tapflow/bpf"
)

type metrics struct {
	packets, bytes         *prometheus.CounterVec // kernel meter, per ifname/direction
	lostPackets, lostBytes *prometheus.CounterVec
	failedUpdates          *prometheus.CounterVec
	skippedNonIP           *prometheus.CounterVec
	records                [8]prometheus.Counter // by end reason
	recordsVec             *prometheus.CounterVec
	attached               prometheus.Gauge
	attachFailures         prometheus.Counter
	tableEntries           prometheus.Gauge
	tableCapacity          prometheus.Gauge
	sweepDeferred          prometheus.Counter
	cacheMerged            prometheus.Counter
	cacheBypasses          prometheus.Counter
	adopted                prometheus.Counter
	unacked                prometheus.Gauge
	exports                prometheus.Counter
	exportSeconds          prometheus.Histogram
	pinDurable             prometheus.Gauge
	strandedRecords        prometheus.Counter
	strandedBytes          prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	lbl := []string{"ifname", "direction"}
	cv := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_capture_" + name, Help: help}, lbl)
	}
	m := &metrics{
		packets:       cv("packets_total", "IP frames seen by the kernel program (the meter)."),
		bytes:         cv("bytes_total", "Bytes (skb->len) of IP frames seen by the kernel program (the meter)."),
		lostPackets:   cv("lost_packets_total", "Packets of records the ring buffer could not take."),
		lostBytes:     cv("lost_bytes_total", "Bytes of records the ring buffer could not take."),
		failedUpdates: cv("failed_map_updates_total", "Flow-table inserts that failed (table full): each became an overflow record."),
		skippedNonIP:  cv("skipped_non_ip_packets_total", "Non-IP frames (ARP, LLDP, …) seen and not counted as flows."),
		recordsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tapflow_capture_records_total", Help: "Flow records read from the ring buffer, by end reason.",
		}, []string{"end_reason"}),
		attached:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_capture_attached_interfaces", Help: "Interfaces the programs are attached to."}),
		attachFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_attach_failures_total", Help: "Failed attempts to attach to an interface."}),
		tableEntries:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_capture_flow_table_entries", Help: "Flow-table entries at the last sweep."}),
		tableCapacity:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_capture_flow_table_capacity", Help: "Flow-table size (max entries, IPv4 and IPv6 tables)."}),
		sweepDeferred:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_sweep_deferred_total", Help: "Sweeps cut short by a full ring buffer (retried; nothing lost)."}),
		cacheMerged:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_flow_cache_merged_total", Help: "Per-CPU flow-cache slots the sweep merged into the flow table."}),
		cacheBypasses: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_flow_cache_bypasses_total",
			Help: "Times a CPU sent its next 65,536 packets straight to the flow table because its flow cache had counted fewer than 1 in 16 of the 1,024 packets it probed before (many flows, few packets of one in a row); a steady rise means the cache does not pay for this traffic. Counted at each sweep."}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_adopted_interfaces_total", Help: "Interfaces whose pinned attachment, table and meters this run took over from a previous one."}),
		exports: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_live_exports_total",
			Help: "Exports of every live flow (ExportLive: before an attribution-changing inventory swap)."}),
		exportSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tapflow_capture_live_export_seconds",
			Help:    "Duration of one export of every live flow (sweep of the tables and flow caches, hand-over included).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9)}),
		pinDurable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_capture_pin_durable",
			Help: "1 when capture.pin_dir is on a bpffs that outlives the agent (a stop leaves the programs counting for the next start); 0 without pinning or when the pin goes away with the agent (every stop detaches)."}),
		strandedRecords: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_stranded_records_total",
			Help: "Flow records a stop left behind with nothing to adopt them: handed over but not acked within the stop's wait, or not exported (a loss unless downstream still delivers them)."}),
		strandedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "tapflow_capture_stranded_bytes_total",
			Help: "Traffic bytes of tapflow_capture_stranded_records_total."}),
		unacked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tapflow_capture_ring_unacked_bytes", Help: "Ring-buffer bytes read and handed downstream but not yet durable (kept in the ring until acked)."}),
	}
	for _, r := range bpf.EndReasons() {
		m.records[r] = m.recordsVec.WithLabelValues(r.String())
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.packets, m.bytes, m.lostPackets, m.lostBytes, m.failedUpdates,
		m.skippedNonIP, m.recordsVec, m.attached, m.attachFailures, m.tableEntries, m.tableCapacity, m.sweepDeferred, m.cacheMerged, m.cacheBypasses, m.adopted, m.unacked, m.exports, m.exportSeconds,
		m.pinDurable, m.strandedRecords, m.strandedBytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register capture metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) addMeter(r *MeterRecord) {
	l := prometheus.Labels{"ifname": r.Ifname, "direction": r.Direction}
	m.packets.With(l).Add(float64(r.Packets))
	m.bytes.With(l).Add(float64(r.Bytes))
	m.lostPackets.With(l).Add(float64(r.LostPackets))
	m.lostBytes.With(l).Add(float64(r.LostBytes))
	m.failedUpdates.With(l).Add(float64(r.FailedUpdates))
	m.skippedNonIP.With(l).Add(float64(r.SkippedNonIP))
}

// preset creates an attached interface's kernel meter and loss series at
// 0, so rate() and increase() alerts see the first loss.
func (m *metrics) preset(ifname string) {
	for _, d := range []string{"tx", "rx"} {
		l := prometheus.Labels{"ifname": ifname, "direction": d}
		for _, v := range []*prometheus.CounterVec{m.packets, m.bytes, m.lostPackets, m.lostBytes, m.failedUpdates, m.skippedNonIP} {
			v.With(l)
		}
	}
}

func (m *metrics) forget(ifname string) {
	for _, d := range []string{"tx", "rx"} {
		l := prometheus.Labels{"ifname": ifname, "direction": d}
		for _, v := range []*prometheus.CounterVec{m.packets, m.bytes, m.lostPackets, m.lostBytes, m.failedUpdates, m.skippedNonIP} {
			v.Delete(l)
		}
	}
}
