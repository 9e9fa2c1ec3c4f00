package publish_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// TestLossCountersExistAtZero: right after construction (nothing run,
// nothing published) every loss, discard and refusal series of the
// publishers and the spool is exposed at 0, so rate() and increase()
// alerts see the first loss.
func TestLossCountersExistAtZero(t *testing.T) {
	s := transporttest.Run(t, "")
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	scfg := spool.DefaultConfig()
	scfg.Dir = dir + "/spool"
	sp, err := spool.New(scfg, spool.Options{Logger: quiet, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	opts := publish.Options{AgentID: "a", Node: "n", StateDir: dir, NATS: transport.DefaultConfig(), Logger: quiet, Registry: reg, Spool: sp}
	if _, err := publish.New(s.JS, opts); err != nil {
		t.Fatal(err)
	}
	opts.Spool = nil
	if _, err := publish.NewMeters(s.JS, opts); err != nil {
		t.Fatal(err)
	}
	type series struct {
		name   string
		labels map[string]string
	}
	want := []series{
		{"tapflow_publish_refused_total", map[string]string{"stream": transport.FlowsStream, "reason": "stream_full"}},
		{"tapflow_publish_refused_total", map[string]string{"stream": transport.MetersStream, "reason": "stream_full"}},
		{"tapflow_publish_retries_total", nil},
		{"tapflow_publish_meter_retries_total", nil},
		{"tapflow_publish_duplicates_total", nil},
		{"tapflow_publish_meter_duplicates_total", nil},
		{"tapflow_publish_id_collisions_total", nil},
		{"tapflow_publish_meter_id_collisions_total", nil},
		{"tapflow_publish_resend_dropped_total", nil},
		{"tapflow_publish_meter_resend_dropped_total", nil},
		{"tapflow_spool_torn_tails_total", nil},
		{"tapflow_spool_corrupt_bytes_total", nil},
		{"tapflow_spool_write_errors_total", nil},
	}
	for _, r := range []string{"full", "write_error", "too_large", "corrupt"} {
		want = append(want,
			series{"tapflow_spool_dropped_batches_total", map[string]string{"reason": r}},
			series{"tapflow_spool_dropped_records_total", map[string]string{"reason": r}})
	}
	for _, w := range want {
		v, ok := gathered(t, reg, w.name, w.labels)
		if !ok {
			t.Errorf("%s%v is not exposed before the first event", w.name, w.labels)
		} else if v != 0 {
			t.Errorf("%s%v = %v at start", w.name, w.labels, v)
		}
	}
}
