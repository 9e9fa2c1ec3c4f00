package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/billing/flowlogs"
	"github.com/tapflow/tapflow/internal/testkit/billingdata"
	"github.com/tapflow/tapflow/internal/testkit/promserver"
	"github.com/tapflow/tapflow/internal/testkit/versitygw"
	"github.com/tapflow/tapflow/schemas"
)

// TestBillingCLI runs tapflow billing publish and status on an output in
// real S3 (versitygw) against Debian's Prometheus, with the shipped
// defaults but for billing.data, billing.prometheus.url and the S3
// endpoint: an hour three hours ago is published and its per-project sums
// in Prometheus are the records' to the byte; publishing it again writes
// nothing; an hour whose audit fails exits 1 naming the mismatch; an
// open hour is refused with the time it closes; status shows all of it.
func TestBillingCLI(t *testing.T) {
	prom := promserver.Start(t)
	gw := versitygw.Start(t, "")
	gw.MakeBucket(t, "lake")
	dir := t.TempDir()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	data := billingdata.Generate(billingdata.Spec{Start: h.Add(-10 * time.Minute), Span: time.Hour + 50*time.Minute})
	skip := map[int]bool{} // H+1 loses records of one tap: held back
	for i, f := range data.Flows {
		if f.Ifname == "tap101-aa" && f.Direction == "tx" && f.TimeStart >= h.Add(70*time.Minute).UnixMicro() && f.TimeEnd < h.Add(80*time.Minute).UnixMicro() {
			skip[i] = true
		}
	}
	if err := billingdata.Write(context.Background(), dir, data, skip); err != nil {
		t.Fatal(err)
	}
	upload(t, gw, dir, "lake", "tapflow")
	t.Setenv("AWS_ACCESS_KEY_ID", versitygw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", versitygw.SecretKey)
	t.Setenv("AWS_REGION", versitygw.Region)
	cfg := filepath.Join(dir, "tapflow.yaml")
	yaml := fmt.Sprintf("data_dir: %s\ncollector:\n  s3:\n    endpoint: %s\n    path_style: true\nbilling:\n  data: s3://lake/tapflow\n  prometheus:\n    url: %s\n",
		dir, gw.Endpoint, prom.WriteURL())
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	hour := func(h time.Time) string { return h.Format("2006-01-02T15") }

	steps := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"publish", []string{"publish", "--hour", hour(h)}, exitOK, []string{" published (revision 0, 44 series written; totals "}},
		{"again", []string{"publish", "--hour", hour(h)}, exitOK, []string{" unchanged (revision 0, 0 series written; totals "}},
		{"held", []string{"publish", "--hour", hour(h.Add(time.Hour))}, exitRuntime, []string{" held (revision -1", "MISMATCH node cmp1 tap tap101-aa tx hour " + h.Add(time.Hour).Format("2006-01-02T15Z")}},
		{"open", []string{"publish", "--hour", hour(time.Now().UTC().Truncate(time.Hour))}, exitUsage, []string{"is not closed until", "--force"}},
		{"not an hour", []string{"publish", "--hour", h.Format("2006-01-02T15:04") + ":30"}, exitUsage, []string{"not the start of an hour"}},
		{"run once", []string{"run", "--once", "--log-level", "error"}, exitRuntime, []string{hour(h.Add(-time.Hour)) + "Z: published (revision 0", hour(h.Add(time.Hour)) + "Z: held"}},
		{"status", []string{"status"}, exitOK, []string{h.Format("2006-01-02T15Z") + "  published  0 ", h.Add(time.Hour).Format("2006-01-02T15Z") + "  held ", h.Add(-time.Hour).Format("2006-01-02T15Z") + "  published  0 "}},
	}
	for _, st := range steps {
		code, out, errs := runTapflow(t, append(append([]string{"billing"}, st.args...), "--config", cfg)...)
		t.Logf("tapflow billing %s: exit %d\n%s%s", strings.Join(st.args, " "), code, out, errs)
		if code != st.code {
			t.Fatalf("%s: exit %d, want %d", st.name, code, st.code)
		}
		for _, w := range st.want {
			if !strings.Contains(out+errs, w) {
				t.Errorf("%s: output lacks %q", st.name, w)
			}
		}
	}

	want := map[string]int64{}
	for _, k := range billingdata.Expected(keptFlows(data.Flows, skip), h) {
		want[k.Project] += k.Bytes
	}
	res, err := prom.Query(context.Background(), `sum(sum_over_time(tapflow_billed_bytes[3600s])) by (project_id)`, h.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("projects in Prometheus: %v, want 2", res)
	}
	for _, s := range res {
		if p := s.Metric["project_id"]; float64(want[p]) != s.Value {
			t.Errorf("project %s: Prometheus %.0f bytes, records %d", p, s.Value, want[p])
		}
	}
}

func keptFlows(flows []schemas.Flow, skip map[int]bool) []schemas.Flow {
	var out []schemas.Flow
	for i, f := range flows {
		if !skip[i] {
			out = append(out, f)
		}
	}
	return out
}

// TestBillingRunService runs `tapflow billing run` as tapflow-billing.service
// does (--metrics-listen on loopback) for 15 s on a local output, with the
// shipped defaults and, in a second case, with tenant flow logs to a real
// S3 server (versitygw, a bucket per project, the delivering credential in
// a credentials file): /metrics serves the billing metrics (and the
// flowlogs ones), the first pass (at once) publishes the closed hour, then
// delivers each project's flow logs of it, and the command exits 0 at the
// end of --duration.
func TestBillingRunService(t *testing.T) {
	for _, tc := range []struct {
		name     string
		flowLogs bool
		want     []string // /metrics lines once the pass is done
	}{
		{name: "defaults", want: []string{"tapflow_billing_hours_published_total 1", "tapflow_billing_deliveries_total 0"}},
		{name: "flow logs", flowLogs: true, want: []string{"tapflow_billing_hours_published_total 1", "tapflow_billing_deliveries_total 1",
			"tapflow_billing_flowlogs_pending_hours 0", "tapflow_flowlogs_hours_delivered_total 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prom := promserver.Start(t)
			dir := t.TempDir()
			h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
			data := billingdata.Generate(billingdata.Spec{Start: h.Add(5 * time.Minute), Span: 50 * time.Minute})
			if err := billingdata.Write(context.Background(), dir, data, nil); err != nil {
				t.Fatal(err)
			}
			yaml := fmt.Sprintf("data_dir: %s\nbilling:\n  prometheus:\n    url: %s\n", dir, prom.WriteURL())
			var gw *versitygw.Server
			if tc.flowLogs {
				gw = versitygw.Start(t, "")
				for _, p := range []string{billingdata.ProjectA, billingdata.ProjectB} {
					gw.MakeBucket(t, "flowlogs-"+p)
				}
				creds := filepath.Join(t.TempDir(), "credentials")
				if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+versitygw.AccessKey+"\naws_secret_access_key = "+versitygw.SecretKey+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				yaml += fmt.Sprintf("  flow_logs:\n    location: s3://flowlogs-{project_id}/tapflow\n    s3:\n      endpoint: %s\n      region: %s\n      path_style: true\n      credentials_file: %s\n",
					gw.Endpoint, versitygw.Region, creds)
			}
			cfg := filepath.Join(dir, "tapflow.yaml")
			if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			addr := freeAddr(t)
			type result struct {
				code      int
				out, errs string
			}
			done := make(chan result, 1)
			go func() {
				var out, errb strings.Builder
				code := run([]string{"billing", "run", "--config", cfg, "--metrics-listen", addr, "--log-format", "text", "--duration", "15s"}, &out, &errb)
				done <- result{code, out.String(), errb.String()}
			}()
			// Generous for a loaded CI machine: the first pass takes about a
			// second here; the command runs its whole --duration anyway.
			deadline := time.Now().Add(14 * time.Second)
			var missing []string
			for ok := false; !ok && time.Now().Before(deadline); {
				if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
					b, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					missing = nil
					for _, w := range tc.want {
						if !strings.Contains(string(b), "\n"+w+"\n") {
							missing = append(missing, w)
						}
					}
					ok = len(missing) == 0
				}
				time.Sleep(50 * time.Millisecond)
			}
			r := <-done
			t.Logf("tapflow billing run: exit %d\n%s%s", r.code, r.out, r.errs)
			if r.code != exitOK || len(missing) > 0 || !strings.Contains(r.errs, "hour published") {
				t.Fatalf("exit %d; /metrics never showed %q", r.code, missing)
			}
			if gw != nil {
				for _, p := range []string{billingdata.ProjectA, billingdata.ProjectB} {
					objs := gw.Objects(t, "flowlogs-"+p, "")
					if len(objs) != 1 || objs["tapflow/"+flowlogs.Key(p, h)] == 0 {
						t.Errorf("project %s's bucket holds %v, want its object of %s", p, objs, h.Format("2006-01-02T15"))
					}
				}
			}
		})
	}
}
