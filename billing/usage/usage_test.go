package usage_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/billingdata"
	"github.com/tapflow/tapflow/internal/testkit/promserver"
	"github.com/tapflow/tapflow/schemas"
)

// corrections records the Corrector calls (the hook CloudKitty's
// reprocess implements in billing/cloudkitty).
type corrections struct {
	mu    sync.Mutex
	calls []string
}

func (c *corrections) Corrected(_ context.Context, h time.Time, projects []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, h.Format("15")+" "+strings.Join(projects, ","))
	return nil
}

// TestPublishAuditedHours is the chain end to end against Debian's real
// Prometheus: Parquet written by the real sink (two projects; same_tenant,
// shared, external over two external networks, infra, an LB) for the hours
// H−1 (its last 10 minutes), H and H+1, H three hours ago, with flow
// records of H+1 missing so its audit fails. With the shipped defaults
// (billing settle derived from the pipeline's, lookback 7d):
//   - a pass publishes H−1 and H and holds H+1 back (counted, findings);
//   - CloudKitty's query at H+1h gives each project's exact bytes and
//     packets per zone, direction, external network and LB, to the byte;
//   - a second pass and publishing H again write nothing;
//   - H−1 and H, first published after CloudKitty rated them
//     (billing.rated_after), are handed to the Corrector;
//   - a late file in H (another agent's flows and meters) publishes only
//     the differences, the query follows to the byte, and the Corrector
//     hears of the projects it changed.
func TestPublishAuditedHours(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prom := promserver.Start(t)
	dir := t.TempDir()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	data := billingdata.Generate(billingdata.Spec{Start: h.Add(-10 * time.Minute), Span: time.Hour + 50*time.Minute})
	// H+1: records of one tap and direction gone (lost between agent and
	// Parquet, as far as the audit can tell).
	skip := map[int]bool{}
	for i, f := range data.Flows {
		if f.Node == "cmp2" && f.Ifname == "tap201-aa" && f.Direction == "rx" &&
			f.TimeStart >= h.Add(70*time.Minute).UnixMicro() && f.TimeEnd < h.Add(90*time.Minute).UnixMicro() {
			skip[i] = true
		}
	}
	if len(skip) < 5 {
		t.Fatalf("only %d records to leave out", len(skip))
	}
	if err := billingdata.Write(ctx, dir, data, skip); err != nil {
		t.Fatal(err)
	}
	var kept []schemas.Flow
	for i, f := range data.Flows {
		if !skip[i] {
			kept = append(kept, f)
		}
	}

	cfg, err := config.Parse([]byte(fmt.Sprintf("data_dir: %s\nbilling:\n  prometheus:\n    url: %s\n", dir, prom.WriteURL())))
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Billing.Usage
	if u.Data != dir || u.StateDir != filepath.Join(dir, "billing") || u.Settle.D() != 6*time.Minute+10*time.Second+5*time.Minute {
		t.Fatalf("resolved billing config: data %s state_dir %s settle %s", u.Data, u.StateDir, u.Settle)
	}
	out, err := dataset.Open(ctx, u.Data, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := promwrite.New(u.Prometheus)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A live sample first, as in a Prometheus that scrapes: the hours
	// published below are then out of order, as in production.
	if err := w.Write(ctx, []promwrite.Series{promwrite.NewSeries("scraped_now", nil, promwrite.Sample{Value: 1, TimestampMs: time.Now().UnixMilli()})}); err != nil {
		t.Fatal(err)
	}
	corr := &corrections{}
	p, err := usage.New(usage.Options{Output: out, Writer: w, StateDir: u.StateDir, Settle: u.Settle.D(), Lookback: u.Lookback.D(), Corrector: corr, RatedAfter: u.RatedAfter.D()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p.Collectors()...)
	metric := func(name string) float64 { return metricValue(t, reg, name) }
	// At 0 from the start.
	if n, err := testutil.GatherAndCount(reg); err != nil || n != len(p.Collectors()) {
		t.Fatalf("%d metrics before the first pass (%v), want %d", n, err, len(p.Collectors()))
	}

	start := time.Now()
	outs, err := p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first pass: %s", time.Since(start).Round(time.Millisecond))
	if got := actions(outs); got != fmt.Sprintf("%s published, %s published, %s held", hs(h.Add(-time.Hour)), hs(h), hs(h.Add(time.Hour))) {
		t.Fatalf("first pass: %s", got)
	}
	held := outs[2]
	if len(held.Findings) == 0 || !strings.Contains(strings.Join(held.Findings, "\n"), "node cmp2 tap tap201-aa rx hour "+h.Add(time.Hour).Format("2006-01-02T15Z")) {
		t.Fatalf("held hour's findings do not name the tap and hour:\n%s", strings.Join(held.Findings, "\n"))
	}
	checkHourTable(ctx, t, prom, h, billingdata.Expected(kept, h), true)
	checkHour(ctx, t, prom, h.Add(-time.Hour), billingdata.Expected(kept, h.Add(-time.Hour)))
	checkAbsent(ctx, t, prom, h.Add(time.Hour))
	for name, want := range map[string]float64{
		"tapflow_billing_hours_published_total": 2, "tapflow_billing_hours_held_back_total": 1, "tapflow_billing_hours_held_back": 1,
		"tapflow_billing_corrections_published_total": 0, "tapflow_billing_publish_errors_total": 0,
		"tapflow_billing_last_published_hour_timestamp_seconds": float64(h.Add(time.Hour).Unix()),
	} {
		if got := metric(name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if lag := metric("tapflow_billing_publish_lag_seconds"); lag < 3600 || lag > 3*3600 {
		t.Errorf("publish lag %vs: H ended 2 to 3 hours ago", lag)
	}

	// Again: nothing new is written; the held hour is retried (and held).
	outs, err = p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(outs); got != hs(h.Add(time.Hour))+" held" {
		t.Fatalf("second pass: %s", got)
	}
	o, err := p.Hour(ctx, h)
	if err != nil || o.Action != usage.ActUnchanged || o.Series != 0 {
		t.Fatalf("publishing %s again: %+v, %v", hs(h), o, err)
	}
	checkHour(ctx, t, prom, h, billingdata.Expected(kept, h))
	if got := metric("tapflow_billing_hours_held_back_total"); got != 2 {
		t.Errorf("held back %v times, want 2", got)
	}

	// A late file in H: another agent (cmp3, project A's VM) whose batches
	// arrive after H was published, flows and meters.
	late := billingdata.Generate(billingdata.Spec{Start: h.Add(20 * time.Minute), Span: 10 * time.Minute, Nodes: 1, Taps: 1, First: 3, Seed: 2})
	if err := billingdata.Write(ctx, dir, late, nil); err != nil {
		t.Fatal(err)
	}
	all := append(slices.Clone(kept), late.Flows...)
	outs, err = p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(outs); got != hs(h)+" corrected, "+hs(h.Add(time.Hour))+" held" {
		t.Fatalf("pass after the late file: %s", got)
	}
	keysA := 0
	for _, k := range billingdata.Expected(all, h) {
		if k.Project == billingdata.ProjectA {
			keysA++
		}
	}
	checkHourTable(ctx, t, prom, h, billingdata.Expected(all, h), true)
	if outs[0].Revision != 1 || outs[0].Series != 2*keysA {
		t.Errorf("correction: revision %d, %d series; want revision 1 and the %d series of project A's %d keys only", outs[0].Revision, outs[0].Series, 2*keysA, keysA)
	}
	checkHour(ctx, t, prom, h, billingdata.Expected(all, h))
	// H−1 and H ended 2 to 4 hours ago, at least billing.rated_after (1h,
	// CloudKitty's default (wait_periods − 1) × period): CloudKitty rated them
	// before their first publication, so both are reprocessed for both
	// projects; then H again for the project the late file changed.
	both := billingdata.ProjectB + "," + billingdata.ProjectA
	if want := []string{h.Add(-time.Hour).Format("15") + " " + both, h.Format("15") + " " + both, h.Format("15") + " " + billingdata.ProjectA}; !slices.Equal(corr.calls, want) {
		t.Errorf("corrector calls %q, want %q", corr.calls, want)
	}
	if got := metric("tapflow_billing_corrections_published_total"); got != 1 {
		t.Errorf("corrections %v, want 1", got)
	}
	// And once more: nothing.
	if outs, err = p.Pass(ctx); err != nil || actions(outs) != hs(h.Add(time.Hour))+" held" {
		t.Fatalf("pass after the correction: %s, %v", actions(outs), err)
	}
	checkHour(ctx, t, prom, h, billingdata.Expected(all, h))

	// The state is the operator's record: not readable by others.
	st, err := os.Stat(filepath.Join(u.StateDir, h.Format("2006-01-02T15")+".json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("state file: %v, mode %v; want 0600", err, st.Mode())
	}
}

// metricValue is the value of the one series of a counter or gauge.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func hs(h time.Time) string { return h.Format("15Z") }

func actions(outs []usage.Outcome) string {
	var s []string
	for _, o := range outs {
		s = append(s, hs(o.Hour)+" "+string(o.Action))
	}
	return strings.Join(s, ", ")
}

// checkHour asks, per project, the query CloudKitty's Prometheus collector
// makes (metrics.yml: aggregation_method sum, groupby the key's labels)
// at the hour's end, and compares it with the records' own sums, to the
// byte.
func checkHour(ctx context.Context, t *testing.T, prom *promserver.Server, h time.Time, want usage.Totals) {
	t.Helper()
	checkHourTable(ctx, t, prom, h, want, false)
}

// checkHourTable is checkHour, logging every key's figures when table.
func checkHourTable(ctx context.Context, t *testing.T, prom *promserver.Server, h time.Time, want usage.Totals, table bool) {
	t.Helper()
	if len(want) < 10 {
		t.Fatalf("hour %s: only %d keys expected; the data is too thin", hs(h), len(want))
	}
	type kv struct{ bytes, packets float64 }
	wants := map[string]map[string]kv{}
	for _, w := range want {
		k := w.Zone + "/" + w.Direction + "/" + w.ExternalNetwork + "/" + w.LB
		if wants[w.Project] == nil {
			wants[w.Project] = map[string]kv{}
		}
		wants[w.Project][k] = kv{float64(w.Bytes), float64(w.Packets)}
	}
	var bytesA, bytesB float64
	for project, keys := range wants {
		got := map[string]kv{}
		for _, m := range []string{usage.BytesMetric, usage.PacketsMetric} {
			q := fmt.Sprintf(`sum(sum_over_time(%s{project_id=%q}[3600s])) by (zone, direction, external_network, lb_id)`, m, project)
			res, err := prom.Query(ctx, q, h.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range res {
				k := s.Metric["zone"] + "/" + s.Metric["direction"] + "/" + s.Metric["external_network"] + "/" + s.Metric["lb_id"]
				v := got[k]
				if m == usage.BytesMetric {
					v.bytes = s.Value
				} else {
					v.packets = s.Value
				}
				got[k] = v
			}
		}
		for k, w := range keys {
			if table {
				t.Logf("  %s %-8s %-34s records %9.0f B %6.0f pkts   PromQL %9.0f B %6.0f pkts", hs(h), project[:8], k, w.bytes, w.packets, got[k].bytes, got[k].packets)
			}
			if got[k] != w {
				t.Errorf("hour %s project %s %s: Prometheus %.0f bytes %.0f packets, records %.0f bytes %.0f packets", hs(h), project, k, got[k].bytes, got[k].packets, w.bytes, w.packets)
			}
			if project == billingdata.ProjectA {
				bytesA += w.bytes
			} else {
				bytesB += w.bytes
			}
		}
		for k, g := range got {
			if _, ok := keys[k]; !ok && (g.bytes != 0 || g.packets != 0) {
				t.Errorf("hour %s project %s %s: Prometheus %v, records none", hs(h), project, k, g)
			}
		}
	}
	t.Logf("hour %s: %d keys, project A %.0f bytes, project B %.0f bytes: Prometheus = records", hs(h), len(want), bytesA, bytesB)
}

// checkAbsent: nothing was published for hour h.
func checkAbsent(ctx context.Context, t *testing.T, prom *promserver.Server, h time.Time) {
	t.Helper()
	res, err := prom.Query(ctx, `count(count_over_time(`+usage.BytesMetric+`[3600s]))`, h.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 0 {
		t.Errorf("hour %s (held back) has samples: %v", hs(h), res)
	}
}

// lostAnswer forwards writes to the receiver and, while lose is set,
// reports them failed anyway: the answer lost on the way back (a timeout,
// a crash right after the write).
type lostAnswer struct {
	w    usage.Writer
	lose bool
}

func (l *lostAnswer) Write(ctx context.Context, s []promwrite.Series) error {
	if err := l.w.Write(ctx, s); err != nil {
		return err
	}
	if l.lose {
		return fmt.Errorf("answer lost")
	}
	return nil
}

// TestPendingWriteResent: a revision written whose answer was lost stays
// pending and is re-sent unchanged at the next pass, even when a late file
// changed the hour meanwhile (the change becomes the next revision), so
// Prometheus ends up with the exact total, not twice the first one, and
// the failure is counted.
func TestPendingWriteResent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prom := promserver.Start(t)
	dir := t.TempDir()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	data := billingdata.Generate(billingdata.Spec{Start: h.Add(5 * time.Minute), Span: 50 * time.Minute})
	if err := billingdata.Write(ctx, dir, data, nil); err != nil {
		t.Fatal(err)
	}
	out, err := dataset.Open(ctx, dir, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := promwrite.New(promwrite.Config{URL: prom.WriteURL(), Timeout: promwrite.DefaultConfig().Timeout})
	if err != nil {
		t.Fatal(err)
	}
	w := &lostAnswer{w: c, lose: true}
	d := config.Default().Billing.Usage
	p, err := usage.New(usage.Options{Output: out, Writer: w, StateDir: filepath.Join(dir, "billing"), Settle: 15 * time.Minute, Lookback: d.Lookback.D()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p.Collectors()...)

	if _, err := p.Pass(ctx); err == nil || !strings.Contains(err.Error(), "answer lost") {
		t.Fatalf("pass with the answer lost: %v", err)
	}
	states, err := p.Status()
	if err != nil || len(states) != 1 || states[0].Pending == nil || states[0].Pending.Revision != 0 {
		t.Fatalf("state after the lost answer: %+v, %v; want revision 0 pending", states, err)
	}
	if n := metricValue(t, reg, "tapflow_billing_publish_errors_total"); n != 1 {
		t.Errorf("publish errors %v, want 1", n)
	}
	late := billingdata.Generate(billingdata.Spec{Start: h.Add(30 * time.Minute), Span: 5 * time.Minute, Nodes: 1, First: 5, Seed: 3})
	if err := billingdata.Write(ctx, dir, late, nil); err != nil {
		t.Fatal(err)
	}
	w.lose = false
	outs, err := p.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Action != usage.ActCorrected || outs[0].Revision != 1 {
		t.Fatalf("pass after: %s (revision %d); want %s corrected at revision 1", actions(outs), outs[0].Revision, hs(h))
	}
	checkHour(ctx, t, prom, h, billingdata.Expected(append(slices.Clone(data.Flows), late.Flows...), h))
}

// TestRunLoop: Run passes at once and then every interval: an hour whose
// file arrives while it runs is published by a later pass; it returns nil
// when its context ends.
func TestRunLoop(t *testing.T) {
	prom := promserver.Start(t)
	dir := t.TempDir()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	out, err := dataset.Open(context.Background(), dir, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := promwrite.New(promwrite.Config{URL: prom.WriteURL(), Timeout: promwrite.DefaultConfig().Timeout})
	if err != nil {
		t.Fatal(err)
	}
	p, err := usage.New(usage.Options{Output: out, Writer: c, StateDir: filepath.Join(dir, "billing"), Settle: 15 * time.Minute, Lookback: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, 200*time.Millisecond) }()
	data := billingdata.Generate(billingdata.Spec{Start: h.Add(5 * time.Minute), Span: 50 * time.Minute})
	if err := billingdata.Write(context.Background(), dir, data, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := p.Status()
		if err != nil {
			t.Fatal(err)
		}
		if len(st) == 1 && st[0].Status == usage.Published {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hour not published within 2m: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	checkHour(context.Background(), t, prom, h, billingdata.Expected(data.Flows, h))
}
