package usage_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/billingdata"
	"github.com/tapflow/tapflow/internal/testkit/promserver"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/schemas"
)

// TestDeliverFlowLogsAfterAudit runs the billing loop's passes with the
// real flow-log delivery (billing/flowlogs, as `tapflow billing run`
// wires it) to a real S3 server (versitygw) and a real Prometheus, on two
// projects' data for the hours H (audit passes) and H+1 (flow records of
// one tap lost: audit fails), H three hours ago, with the shipped defaults
// and billing.flow_logs.location s3://flowlogs-{project_id}/tapflow. The
// delivering process uses the gateway's root credential from a
// credentials file; which project may read which object is
// billing/flowlogs' TestDeliverTenantAccess. Pass after pass:
//   - project B's bucket is missing: H is published, project A's flow logs
//     are delivered, the failure is counted and H stays pending; H+1, held
//     back by its audit, delivers nothing;
//   - the next pass retries the delivery (still failing, counted again);
//   - once the bucket exists, the next pass delivers H (A's object is
//     rewritten identically) and nothing is pending;
//   - a pass with nothing changed delivers nothing;
//   - a late file of project A in H corrects the hour and delivers it
//     again: A's object changes and holds the late records, B's does not.
func TestDeliverFlowLogsAfterAudit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	prom := promserver.Start(t)
	srv := versitygw.Start(t, "")
	dir := t.TempDir()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	data := billingdata.Generate(billingdata.Spec{Start: h.Add(5 * time.Minute), Span: time.Hour + 50*time.Minute})
	skip := map[int]bool{} // H+1: one tap's rx records lost
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
	var flows []schemas.Flow
	for i, f := range data.Flows {
		if !skip[i] {
			flows = append(flows, f)
		}
	}

	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+versitygw.AccessKey+"\naws_secret_access_key = "+versitygw.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(fmt.Appendf(nil, `data_dir: %s
billing:
  prometheus:
    url: %s
  flow_logs:
    location: s3://flowlogs-{project_id}/tapflow
    s3:
      endpoint: %s
      region: %s
      path_style: true
      credentials_file: %s
`, dir, prom.WriteURL(), srv.Endpoint, versitygw.Region, creds))
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Billing.Usage
	out, err := dataset.Open(ctx, u.Data, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := promwrite.New(u.Prometheus)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	reg := prometheus.NewPedanticRegistry()
	d, err := flowlogs.New(cfg.Billing.FlowLogs, out, flowlogs.Options{Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := usage.New(usage.Options{Output: out, Writer: w, StateDir: u.StateDir, Settle: u.Settle.D(), Lookback: u.Lookback.D(), RatedAfter: u.RatedAfter.D(),
		Delivery: usage.DeliveryFunc(func(ctx context.Context, h time.Time) error { _, err := d.Deliver(ctx, h); return err })})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(p.Collectors()...)
	for _, name := range []string{"tapflow_billing_deliveries_total", "tapflow_billing_delivery_errors_total", "tapflow_billing_flowlogs_pending_hours",
		"tapflow_flowlogs_hours_delivered_total", "tapflow_flowlogs_delivery_failures_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
			t.Fatalf("%s: %d series before the first pass (%v), want 1 at 0", name, n, err)
		}
	}

	bucket := map[string]string{billingdata.ProjectA: "flowlogs-" + billingdata.ProjectA, billingdata.ProjectB: "flowlogs-" + billingdata.ProjectB}
	key := map[string]string{}
	for pr := range bucket {
		key[pr] = "tapflow/" + flowlogs.Key(pr, h)
	}
	made := map[string]bool{}
	mkBucket := func(b string) { srv.MakeBucket(t, b); made[b] = true }
	// objects lists both buckets: project → its object's content (hex).
	objects := func() map[string]string {
		got := map[string]string{}
		for pr, b := range bucket {
			if !made[b] {
				continue
			}
			objs := srv.Objects(t, b, "")
			if len(objs) > 1 || (len(objs) == 1 && objs[key[pr]] == 0) {
				t.Fatalf("bucket %s holds %v; want only %s (H+1 is held back)", b, objs, key[pr])
			}
			if len(objs) == 1 {
				got[pr] = fmt.Sprintf("%x", srv.Get(t, b, key[pr]))
			}
		}
		return got
	}
	// rows counts the records in project pr's object.
	rows := func(pr string) int64 {
		body := srv.Get(t, bucket[pr], key[pr])
		f, err := pq.OpenFile(bytes.NewReader(body), int64(len(body)))
		if err != nil {
			t.Fatalf("%s's object: %v", pr, err)
		}
		return f.NumRows()
	}
	own := func(flows []schemas.Flow, pr string) (n int64) {
		for _, f := range flows {
			if f.TenantID == pr && f.TimeEnd >= h.UnixMicro() && f.TimeEnd < h.Add(time.Hour).UnixMicro() {
				n++
			}
		}
		return n
	}
	labeled := func(name, project string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == project {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}

	a, b := billingdata.ProjectA, billingdata.ProjectB
	steps := []struct {
		name    string
		before  func()
		actions string
		// usage's counters and gauge after the pass
		delivered, errors, pending float64
		// the projects whose object is there, and those whose object
		// changed (or appeared) in this pass
		present, changed []string
		// each project's flow-log deliveries (tapflow_flowlogs_deliveries_total) after the pass
		deliveries map[string]float64
	}{
		{name: "B's bucket missing", before: func() { mkBucket(bucket[a]) },
			actions: hs(h) + " published, " + hs(h.Add(time.Hour)) + " held", errors: 1, pending: 1,
			present: []string{a}, changed: []string{a}, deliveries: map[string]float64{a: 1, b: 0}},
		{name: "still missing: retried", actions: hs(h.Add(time.Hour)) + " held", errors: 2, pending: 1,
			present: []string{a}, deliveries: map[string]float64{a: 2, b: 0}},
		{name: "bucket created: delivered", before: func() { mkBucket(bucket[b]) },
			actions: hs(h.Add(time.Hour)) + " held", delivered: 1, errors: 2,
			present: []string{a, b}, changed: []string{b}, deliveries: map[string]float64{a: 3, b: 1}},
		{name: "nothing changed: not delivered again", actions: hs(h.Add(time.Hour)) + " held", delivered: 1, errors: 2,
			present: []string{a, b}, deliveries: map[string]float64{a: 3, b: 1}},
		{name: "late file of A: delivered again", before: func() {
			late := billingdata.Generate(billingdata.Spec{Start: h.Add(20 * time.Minute), Span: 10 * time.Minute, Nodes: 1, Taps: 1, First: 3, Seed: 2})
			if err := billingdata.Write(ctx, dir, late, nil); err != nil {
				t.Fatal(err)
			}
			flows = append(flows, late.Flows...)
		}, actions: hs(h) + " corrected, " + hs(h.Add(time.Hour)) + " held", delivered: 2, errors: 2,
			present: []string{a, b}, changed: []string{a}, deliveries: map[string]float64{a: 4, b: 2}},
	}
	prev := map[string]string{}
	for _, s := range steps {
		if s.before != nil {
			s.before()
		}
		start := time.Now()
		outs, err := p.Pass(ctx)
		if err != nil {
			t.Fatalf("%s: pass: %v", s.name, err)
		}
		t.Logf("%s: pass %s", s.name, time.Since(start).Round(time.Millisecond))
		if got := actions(outs); got != s.actions {
			t.Errorf("%s: pass did %q, want %q", s.name, got, s.actions)
		}
		for name, want := range map[string]float64{"tapflow_billing_deliveries_total": s.delivered,
			"tapflow_billing_delivery_errors_total": s.errors, "tapflow_billing_flowlogs_pending_hours": s.pending} {
			if got := metricValue(t, reg, name); got != want {
				t.Errorf("%s: %s = %v, want %v", s.name, name, got, want)
			}
		}
		for pr, want := range s.deliveries {
			if got := labeled("tapflow_flowlogs_deliveries_total", pr); got != want {
				t.Errorf("%s: tapflow_flowlogs_deliveries_total{project_id=%s} = %v, want %v", s.name, pr, got, want)
			}
		}
		now := objects()
		if got := slices.Sorted(maps.Keys(now)); !slices.Equal(got, slices.Sorted(slices.Values(s.present))) {
			t.Errorf("%s: objects of %v, want %v", s.name, got, s.present)
		}
		var changed []string
		for pr, o := range now {
			if prev[pr] != o {
				changed = append(changed, pr)
			}
			if got, want := rows(pr), own(flows, pr); got != want {
				t.Errorf("%s: %s's object holds %d records, want its %d of hour %s", s.name, pr, got, want, hs(h))
			}
		}
		if !slices.Equal(slices.Sorted(slices.Values(changed)), slices.Sorted(slices.Values(s.changed))) {
			t.Errorf("%s: objects changed for %v, want %v", s.name, changed, s.changed)
		}
		prev = now
	}
	st, err := p.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Hour.Equal(h) && (s.Delivered != s.Files || s.Delivered == "") {
			t.Errorf("state of %s: delivered %q, files %q", hs(h), s.Delivered, s.Files)
		}
		if !s.Hour.Equal(h) && s.Delivered != "" {
			t.Errorf("state of %s (%s): delivered %q", hs(s.Hour), s.Status, s.Delivered)
		}
	}
}
