package app

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/bpf"
	dashboards "github.com/tapflow/tapflow/deploy/grafana"
	promrules "github.com/tapflow/tapflow/deploy/prometheus"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/sinks/s3out"
	"github.com/tapflow/tapflow/transport"
)

// httpGet returns the status and body of GET url ("" and 0 when the
// server does not answer).
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape parses GET /metrics.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// waitReady polls /readyz until 200; it fails the test with the last
// reason after d.
func waitReady(t *testing.T, base string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var code int
	var body string
	for time.Now().Before(deadline) {
		if code, body = httpGet(t, base+"/readyz"); code == http.StatusOK {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/readyz never 200 within %s: last %d %q", d, code, body)
}

// process is one process's metrics: every name its registry holds and a
// /metrics scrape (or Gather) taken when it was ready.
type process struct {
	name  string
	names []string
	fams  map[string]*dto.MetricFamily
}

// runProcessMetrics starts `tapflow run` (synthetic source, embedded
// NATS, metrics.listen on loopback) and returns its metrics as scraped
// the moment /readyz first says ready, and the /readyz answer once the
// stop has begun (the HTTP server still serving: the collector drains).
func runProcessMetrics(t *testing.T) (process, int, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.Metrics.Listen = freeLoopbackAddr(t)
	base := "http://" + cfg.Metrics.Listen
	rt := &runtime{log: quiet, reg: obs.NewRegistry(), ready: obs.NewReadiness()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type stopAnswer struct {
		code int
		body string
	}
	stopped := make(chan stopAnswer, 1)
	done := make(chan error, 1)
	go func() {
		done <- runtimeBody(ctx, cfg, rt, waitForNATS, func(ctx context.Context, rt *runtime) error {
			errc := make(chan error, 1)
			go func() { errc <- runAll(ctx, cfg, rt) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			// The stop has begun: the agent flushes, the collector
			// drains, and /readyz already says no.
			code, body := httpGet(t, base+"/readyz")
			stopped <- stopAnswer{code, body}
			return <-errc
		})
	}()
	waitReady(t, base, 60*time.Second)
	p := process{name: "run", fams: scrape(t, base), names: rt.reg.Names()}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	a := <-stopped
	return p, a.code, a.body
}

// serveProcessMetrics runs `tapflow inventory serve` (provider file)
// against a test NATS and scrapes it once ready.
func serveProcessMetrics(t *testing.T) process {
	t.Helper()
	dir := t.TempDir()
	srv := transporttest.Run(t, filepath.Join(dir, "nats"))
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "inv-1", dir
	cfg.NATS.URL = srv.ClientURL()
	cfg.Inventory.Provider = "file"
	cfg.Inventory.File = filepath.Join(dir, "inventory.yaml")
	writePorts(t, cfg.Inventory.File, 3)
	cfg.Metrics.Listen = freeLoopbackAddr(t)
	cfg.Resolve()
	reg := obs.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runInventoryServe(ctx, cfg, quiet, reg, obs.NewReadiness()) }()
	base := "http://" + cfg.Metrics.Listen
	waitReady(t, base, 60*time.Second)
	p := process{name: "inventory serve", fams: scrape(t, base), names: reg.Names()}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("inventory serve: %v", err)
	}
	return p
}

// gathered wraps a registry built without running (constructors register
// everything and start nothing).
func gatheredProcess(t *testing.T, name string, reg *obs.Registry) process {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	p := process{name: name, names: reg.Names(), fams: map[string]*dto.MetricFamily{}}
	for _, mf := range mfs {
		p.fams[mf.GetName()] = mf
	}
	return p
}

// builtProcesses are the parts no synthetic run reaches, built as the
// binary builds them: the eBPF agent with provider nats (capture, meter
// feed and publisher, snapshot subscriber, MAC lookups; root only, since
// the agent checks the kernel first), the OpenStack provider and the S3
// output.
func builtProcesses(t *testing.T) []process {
	t.Helper()
	var out []process
	dir := t.TempDir()
	if err := bpf.CheckKernel(); err == nil {
		srv := transporttest.Run(t, filepath.Join(dir, "nats"))
		cfg := testConfig(t, dir)
		cfg.Source = "ebpf"
		cfg.Inventory.Provider = "nats"
		rt := newRT(t, srv.JS)
		rt.nc = srv.NC
		rt.pm = nil
		rt.reg = obs.NewRegistry()
		if _, err := newAgent(cfg, rt); err != nil {
			t.Fatalf("ebpf agent: %v", err)
		}
		out = append(out, gatheredProcess(t, "agent (source ebpf, provider nats)", rt.reg))
	} else if strict, why := prereq.Strict(); strict {
		t.Fatalf("the eBPF agent cannot be built (%s): %v", why, err)
	} else {
		t.Logf("neither root nor CI: the eBPF agent's metrics are not checked (%v)", err)
	}

	reg := obs.NewRegistry()
	ocfg := config.Default().Inventory.OpenStackConfig()
	ocfg.NoAuth = &openstack.NoAuthConfig{Neutron: "http://127.0.0.1:9"}
	if _, err := openstack.New(ocfg, quiet, reg); err != nil {
		t.Fatalf("openstack provider: %v", err)
	}
	out = append(out, gatheredProcess(t, "openstack provider", reg))

	// An agent with node-scoped views (inventory.scope: node): its
	// overlay counter.
	vsrv := transporttest.Run(t, filepath.Join(dir, "nats-views"))
	vcfg := testConfig(t, dir)
	vcfg.Inventory.Provider, vcfg.Inventory.Scope = "nats", "node"
	vrt := newRT(t, vsrv.JS)
	vrt.nc = vsrv.NC
	vrt.reg = obs.NewRegistry()
	if _, err := newAgent(vcfg, vrt); err != nil {
		t.Fatalf("agent with inventory.scope node: %v", err)
	}
	out = append(out, gatheredProcess(t, "agent (provider nats, inventory.scope node)", vrt.reg))

	reg = obs.NewRegistry()
	if _, err := s3out.New("s3://bucket/prefix", s3out.DefaultConfig(), s3out.Options{Logger: quiet, Registry: reg}); err != nil {
		t.Fatalf("s3 output: %v", err)
	}
	out = append(out, gatheredProcess(t, "s3 output", reg))

	// Tenant flow logs (billing/flowlogs): the billing process's; no
	// project listed, so per-project series start with each project.
	reg = obs.NewRegistry()
	fcfg := flowlogs.DefaultConfig()
	fcfg.Location, fcfg.StagingDir = "s3://flowlogs-{project_id}/tapflow", dir
	src, err := dataset.Open(context.Background(), dir, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := flowlogs.New(fcfg, src, flowlogs.Options{Logger: quiet, Registry: reg}); err != nil {
		t.Fatalf("flow logs: %v", err)
	}
	out = append(out, gatheredProcess(t, "tenant flow logs", reg))
	out = append(out, billingProcess(t))
	return out
}

// allProcesses is every process kind's metrics.
func allProcesses(t *testing.T) []process {
	t.Helper()
	run, _, _ := runProcessMetrics(t)
	return append([]process{run, serveProcessMetrics(t)}, builtProcesses(t)...)
}

// lossName matches the counters that count something lost, dropped,
// refused or failed: each must exist (at 0) from start, or rate() and
// increase() alerts miss the first one.
var lossName = regexp.MustCompile(`lost|bad_|drop|discard|error|dlq|collision|reject|corrupt|refused|violation|fail|nack|naks|unresolved|torn|unanswered|stranded`)

// lossCounters is the explicit list (the pattern above finds any new
// one; this list catches a pattern that stops matching).
var lossCounters = []string{
	"tapflow_stage_discarded_records_total",
	"tapflow_stage_errors_total",
	"tapflow_spool_dropped_batches_total",
	"tapflow_spool_dropped_records_total",
	"tapflow_spool_write_errors_total",
	"tapflow_spool_torn_tails_total",
	"tapflow_spool_corrupt_bytes_total",
	"tapflow_publish_refused_total",
	"tapflow_publish_id_collisions_total",
	"tapflow_publish_meter_id_collisions_total",
	"tapflow_publish_resend_dropped_total",
	"tapflow_publish_meter_resend_dropped_total",
	"tapflow_nats_permission_violations_total",
	"tapflow_consume_corrupt_messages_total",
	"tapflow_consume_rejected_messages_total",
	"tapflow_consume_dlq_errors_total",
	"tapflow_consume_naks_total",
	"tapflow_parquet_commit_errors_total",
	"tapflow_backlog_poll_errors_total",
	"tapflow_enrich_bad_records_total",
	"tapflow_enrich_late_binding_unresolved_total",
	"tapflow_capture_lost_packets_total",
	"tapflow_capture_lost_bytes_total",
	"tapflow_capture_failed_map_updates_total",
	"tapflow_capture_attach_failures_total",
	"tapflow_capture_batches_nacked_total",
	"tapflow_capture_meter_records_lost_total",
	"tapflow_capture_stranded_records_total",
	"tapflow_capture_stranded_bytes_total",
	"tapflow_inventory_errors_total",
	"tapflow_s3_upload_failures_total",
	"tapflow_flowlogs_delivery_failures_total",
	"tapflow_flowlogs_hours_failed_total",
	"tapflow_synthetic_batches_nacked_total",
	"tapflow_billing_publish_errors_total",
	"tapflow_billing_corrector_errors_total",
	"tapflow_billing_pass_errors_total",
}

// perInterface are the loss counters labelled by interface: their series
// are created at 0 when an interface attaches (no interface, no series;
// TestRunEBPFConservation checks they are there once the taps attach).
var perInterface = map[string]bool{
	"tapflow_capture_lost_packets_total":           true,
	"tapflow_capture_lost_bytes_total":             true,
	"tapflow_capture_failed_map_updates_total":     true,
	"tapflow_capture_skipped_non_ip_packets_total": true,
}

// dynamicLabels are loss counters whose label values are only known when
// the loss happens (the failing endpoint and its HTTP code).
var dynamicLabels = map[string]string{
	"tapflow_inventory_errors_total":          "labels endpoint and code are the failing request's",
	"tapflow_flowlogs_project_failures_total": "label project_id is the failing project's (pre-created for billing.flow_logs.projects)",
}

// TestLossCountersExistAtZeroFromStart: every counter of every process
// kind whose name says lost, dropped, discarded, refused, failed, … is on
// /metrics from the start with every label value pre-created, at 0.
func TestLossCountersExistAtZeroFromStart(t *testing.T) {
	procs := allProcesses(t)
	seen := map[string]bool{}
	for _, p := range procs {
		for _, name := range p.names {
			if !strings.HasPrefix(name, "tapflow_") || !lossName.MatchString(name) {
				continue
			}
			seen[name] = true
			mf, ok := p.fams[name]
			switch {
			case !ok && perInterface[name]:
				continue
			case !ok && dynamicLabels[name] != "":
				t.Logf("%s: %s: no series until the first error (%s)", p.name, name, dynamicLabels[name])
				continue
			case !ok:
				t.Errorf("%s: %s is registered but has no series at start: pre-create every label value (WithLabelValues) in the constructor", p.name, name)
				continue
			}
			if mf.GetType() != dto.MetricType_COUNTER {
				continue
			}
			for _, m := range mf.GetMetric() {
				if v := m.GetCounter().GetValue(); v != 0 {
					t.Errorf("%s: %s%v = %v at start, want 0", p.name, name, labelString(m), v)
				}
			}
		}
	}
	for _, name := range lossCounters {
		if !seen[name] {
			// The capture and the meter publisher exist only in the eBPF agent,
			// built only where the kernel lets it (without root or CI).
			if name == "" || ((strings.HasPrefix(name, "tapflow_capture_") || strings.HasPrefix(name, "tapflow_publish_meter_")) && bpf.CheckKernel() != nil) {
				continue
			}
			t.Errorf("%s: in the explicit list but registered by no process (renamed? update the list, the rules and the dashboards)", name)
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%d loss counters checked: %s", len(names), strings.Join(names, " "))
}

func labelString(m *dto.Metric) string {
	var b []string
	for _, l := range m.GetLabel() {
		b = append(b, l.GetName()+"="+l.GetValue())
	}
	return "{" + strings.Join(b, ",") + "}"
}

// TestReadyzAtStartAndShutdown (run, embedded NATS): /readyz becomes 200
// once NATS, the streams and the inventory are ready, and answers 503
// "shutting down" as soon as the stop begins, while the collector still
// drains; /healthz is never the readiness.
func TestReadyzAtStartAndShutdown(t *testing.T) {
	p, code, body := runProcessMetrics(t)
	if _, ok := p.fams["tapflow_build_info"]; !ok {
		t.Error("tapflow_build_info not on /metrics")
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz once the stop began = %d %q, want 503 shutting down", code, body)
	}
}

// TestReadyzFollowsNATS (agent, external NATS): 503 naming NATS while it
// is unreachable, 200 once it answers and the streams exist, 503 again
// when it goes away.
func TestReadyzFollowsNATS(t *testing.T) {
	addr := freeLoopbackAddr(t)
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.NATS.URL = "nats://" + addr
	cfg.Metrics.Listen = freeLoopbackAddr(t)
	base := "http://" + cfg.Metrics.Listen
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunAgent(ctx, cfg, quiet) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Error("agent did not stop")
		}
	})

	wantNotReady := func(what, reason string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		var code int
		var body string
		for time.Now().Before(deadline) {
			code, body = httpGet(t, base+"/readyz")
			if code == http.StatusServiceUnavailable && strings.Contains(body, reason) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: /readyz = %d %q, want 503 with %q", what, code, body, reason)
	}
	wantNotReady("NATS down at start", "nats: not connected")
	if code, _ := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d while not ready, want 200 (liveness)", code)
	}

	srv, err := transport.NewEmbedded(t.TempDir(), addr, "late", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = srv.Close()
		}
	})
	waitReady(t, base, 90*time.Second)

	stopped = true
	if err := srv.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("nats close: %v", err)
	}
	wantNotReady("NATS gone", "nats: not connected")
}

// interfaceLossAtZero checks that each attached interface has its
// per-interface loss series, both directions, at 0 (before traffic).
func interfaceLossAtZero(t *testing.T, reg prometheus.Gatherer, ifnames ...string) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]float64{}
	for _, mf := range mfs {
		if !perInterface[mf.GetName()] {
			continue
		}
		for _, m := range mf.GetMetric() {
			have[mf.GetName()+labelString(m)] = m.GetCounter().GetValue()
		}
	}
	for name := range perInterface {
		for _, ifn := range ifnames {
			for _, d := range []string{"tx", "rx"} {
				key := name + "{direction=" + d + ",ifname=" + ifn + "}"
				v, ok := have[key]
				if !ok {
					t.Errorf("%s missing once %s is attached", key, ifn)
				} else if v != 0 && !strings.Contains(name, "non_ip") {
					t.Errorf("%s = %v before any traffic", key, v)
				}
			}
		}
	}
}

// TestDashboardsAndRulesUseExposedMetrics: every tapflow_* name in the
// alert and recording rules (expressions and annotations), in their unit
// tests' input series and in the Grafana dashboards is registered by a
// process of the binary, so a renamed metric cannot leave a dashboard
// blank or an alert silent.
func TestDashboardsAndRulesUseExposedMetrics(t *testing.T) {
	exposed := map[string]bool{}
	for _, p := range allProcesses(t) {
		for _, n := range p.names {
			exposed[n] = true
		}
	}
	prereq.Require(t, "eBPF capture, to list the capture's metrics", bpf.CheckKernel(), "run as root on a kernel with BTF")
	files := map[string][]byte{"deploy/prometheus/tapflow-rules.yml": promrules.Rules, "deploy/prometheus/tests/tapflow-rules.test.yml": promrules.Tests}
	ds, err := fs.Glob(dashboards.Files, "*.json")
	if err != nil || len(ds) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	for _, n := range ds {
		b, err := dashboards.Files.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files["deploy/grafana/"+n] = b
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs: %v", err)
	}
	for _, d := range append(docs, "../../README.md") {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(d, "../../")] = b
	}
	// docs/operations.md documents every metric the binary exposes.
	documented := map[string]bool{}
	for _, n := range promrules.MetricNames(files["docs/operations.md"]) {
		documented[n] = true
	}
	for n := range exposed {
		if strings.HasPrefix(n, "tapflow_") && !documented[n] {
			t.Errorf("docs/operations.md, Metrics: %s is exposed but not documented", n)
		}
	}
	used := 0
	for file, text := range files {
		for _, name := range promrules.MetricNames(text) {
			used++
			base := name
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suf); ok && exposed[b] {
					base = b
				}
			}
			if !exposed[base] {
				t.Errorf("%s uses %s, which no tapflow process exposes", file, name)
			}
		}
	}
	t.Logf("%d metric names used across %d files, all exposed (%d exposed in all)", used, len(files), len(exposed))
}
