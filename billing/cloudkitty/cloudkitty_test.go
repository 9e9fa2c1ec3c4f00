package cloudkitty_test

// TestCloudKittyRatesExactHour runs against Debian 12's real CloudKitty 17
// (cloudkitty-api, cloudkitty-processor), Prometheus 2.42 and InfluxDB 1.6
// wired to the real Keystone of deploy/openstack-testbed:
//
//   - TAPFLOW_OPENSTACK_STATE=DIR uses a testbed started with up.sh DIR
//     (make test-openstack starts one); cloudkitty-up.sh DIR is run on it
//     when it has no CloudKitty yet;
//   - otherwise the test skips, saying so (opt-in, like the register and
//     contract tests: make test-openstack runs it).
//
// With a testbed given, a missing package fails the test as root or in CI
// (internal/testkit/prereq).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/billing/cloudkitty"
	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/billing/usage"
	testbed "github.com/tapflow/tapflow/deploy/openstack-testbed"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/billingdata"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/schemas"
)

var (
	scripts, _  = filepath.Abs(filepath.Join("..", "..", "deploy", "openstack-testbed"))
	deployCK, _ = filepath.Abs(filepath.Join("..", "..", "deploy", "cloudkitty"))
)

// Prices per GB of the test, passed to deploy/cloudkitty/hashmap-example.sh
// (its defaults plus a second external network).
var (
	zonePrices     = map[string]string{"same_tenant": "0.002", "other_tenant": "0.01", "shared": "0.01"}
	externalPrices = map[string]string{billingdata.External1: "0.05", billingdata.External2: "0.08"}
)

// series is one tapflow_billed_bytes series of the test hour.
type series struct {
	zone, direction, extnet, lb string
	bytes                       int64
}

// bigTraffic is an hour of large totals, above and below 1e9 (the
// collector's 9 significant digits: metrics.yml splits them), for a third
// project; billingdata's records are far smaller.
func bigTraffic(variant int64) []series {
	return []series{
		{"same_tenant", "egress", "none", "none", 734_219_871 + variant},
		{"same_tenant", "ingress", "none", "none", 5_123_456_789_012 + variant},
		{"shared", "egress", "none", "none", 48_000_000_001 + variant},
		{"external", "egress", billingdata.External1, "none", 1_234_567_891_234 + variant},
		{"external", "ingress", billingdata.External1, "none", 999_999_999 + variant},
		{"external", "egress", billingdata.External2, "none", 77_777_777_777 + variant},
		{"external", "ingress", billingdata.External2, "lb-0001", 3_000_000_000 + variant},
		{"infra", "egress", "none", "none", 12_345 + variant},
	}
}

func testbedEnv(t *testing.T) (string, map[string]string) {
	t.Helper()
	dir := os.Getenv("TAPFLOW_OPENSTACK_STATE")
	if dir == "" {
		// deliberate skip: opt-in, make test-openstack runs it against the testbed it starts.
		t.Skip("CloudKitty test: set TAPFLOW_OPENSTACK_STATE to a running deploy/openstack-testbed (up.sh DIR); `make test-openstack` does")
	}
	if out, err := exec.Command(filepath.Join(scripts, "install.sh"), "--check").CombinedOutput(); err != nil {
		prereq.Missing(t, "Debian packages for the testbed and CloudKitty: "+strings.TrimSpace(string(out)), "run "+scripts+"/install.sh as root")
	}
	env, err := testbed.ReadEnv(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatalf("TAPFLOW_OPENSTACK_STATE=%s: %v (start it with %s/up.sh %s)", dir, err, scripts, dir)
	}
	if env["CLOUDKITTY_URL"] == "" {
		start := time.Now()
		out, err := exec.Command(filepath.Join(scripts, "cloudkitty-up.sh"), dir).CombinedOutput()
		if err != nil {
			t.Fatalf("cloudkitty-up.sh %s: %v\n%s", dir, err, out)
		}
		t.Logf("cloudkitty-up.sh took %s:\n%s", time.Since(start).Round(100*time.Millisecond), out)
		if env, err = testbed.ReadEnv(filepath.Join(dir, "env")); err != nil {
			t.Fatal(err)
		}
	}
	return dir, env
}

// service runs service.sh DIR ACTION NAME.
func service(t *testing.T, dir, action, name string) {
	t.Helper()
	if out, err := exec.Command(filepath.Join(scripts, "service.sh"), dir, action, name).CombinedOutput(); err != nil {
		t.Fatalf("service.sh %s %s: %v\n%s", action, name, err, out)
	}
}

// keystoneWrite runs a Keystone write; the testbed's Keystone on SQLite
// can hold a read lock after which writes fail with HTTP 500 "database is
// locked" until it restarts (deploy/openstack-testbed/README.md): restart
// it and retry.
func keystoneWrite(t *testing.T, dir, ksURL string, what string, f func() error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return
		}
		if !gophercloud.ResponseCodeIs(err, 500) || attempt == 4 {
			t.Fatalf("keystone: %s: %v", what, err)
		}
		t.Logf("keystone: %s: %v; restarting keystone (SQLite lock)", what, err)
		service(t, dir, "stop", "keystone")
		service(t, dir, "start", "keystone")
		waitFor(t, 2*time.Minute, "keystone to answer", func() (bool, string) {
			out, err := exec.Command("curl", "-sf", "-o", "/dev/null", ksURL+"/v3").CombinedOutput()
			return err == nil, string(out)
		})
	}
}

// waitFor polls cond every second until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		if state != "" {
			last = state
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s; last state: %s", d, what, last)
		}
		time.Sleep(time.Second)
	}
}

// expectation is the exact bill of one (project, zone, external network).
type expectation struct {
	bytes int64
	price *big.Rat
}

type rowKey struct{ project, zone, extnet string }

func expected(t *testing.T, projects map[string][]series) map[rowKey]*expectation {
	t.Helper()
	out := map[rowKey]*expectation{}
	for p, ss := range projects {
		for _, s := range ss {
			k := rowKey{p, s.zone, s.extnet}
			e := out[k]
			if e == nil {
				e = &expectation{price: new(big.Rat)}
				out[k] = e
			}
			e.bytes += s.bytes
			perGB := "0"
			if s.zone == "external" {
				if v, ok := externalPrices[s.extnet]; ok {
					perGB = v
				}
			} else if v, ok := zonePrices[s.zone]; ok {
				perGB = v
			}
			r, ok := new(big.Rat).SetString(perGB)
			if !ok {
				t.Fatalf("price %q", perGB)
			}
			r.Mul(r, new(big.Rat).SetInt64(s.bytes))
			r.Quo(r, big.NewRat(1_000_000_000, 1))
			e.price.Add(e.price, r)
		}
	}
	return out
}

// rated sums CloudKitty's summary rows of both metrics.yml services per
// (project, zone, external network).
func rated(t *testing.T, ctx context.Context, c *cloudkitty.Client, hour time.Time, ids []string) map[rowKey][2]float64 {
	t.Helper()
	rows, err := c.Summary(ctx, cloudkitty.SummaryQuery{
		Begin: hour, End: hour.Add(time.Hour),
		GroupBy: []string{"type", "project_id", "zone", "external_network"},
		Filters: map[string][]string{"project_id": ids, "type": {"billed_bytes", "billed_bytes_e9"}},
	})
	if err != nil {
		t.Fatalf("summary: %v", err)
	}
	out := map[rowKey][2]float64{}
	for _, r := range rows {
		k := rowKey{r.Groups["project_id"], r.Groups["zone"], r.Groups["external_network"]}
		v := out[k]
		v[0] += r.Qty
		v[1] += r.Rate
		out[k] = v
	}
	return out
}

// compare checks every row to the byte and the price to 1e-9 of a
// currency unit (CloudKitty keeps prices as float64 in InfluxDB), and
// returns the table for the log.
func compare(t *testing.T, names map[string]string, exp map[rowKey]*expectation, got map[rowKey][2]float64) (string, int) {
	t.Helper()
	keys := make([]rowKey, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	for k := range got {
		if exp[k] == nil {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return names[a.project]+a.zone+a.extnet < names[b.project]+b.zone+b.extnet
	})
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "%-9s %-12s %-8s %18s %18s %16s %16s %s\n", "project", "zone", "ext_net", "tapflow bytes", "cloudkitty qty", "expected price", "cloudkitty price", "")
	bad := 0
	for _, k := range keys {
		e, g := exp[k], got[k]
		if e == nil {
			e = &expectation{price: new(big.Rat)}
		}
		ep, _ := e.price.Float64()
		ok := g[0] == float64(e.bytes) && abs(g[1]-ep) <= 1e-9
		mark := "ok"
		if !ok {
			mark = "MISMATCH"
			bad++
		}
		fmt.Fprintf(&buf, "%-9s %-12s %-8s %18d %18.0f %16s %16.9f %s\n", names[k.project], k.zone, k.extnet, e.bytes, g[0], e.price.FloatString(9), g[1], mark)
	}
	return buf.String(), bad
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// TestCloudKittyRatesExactHour: the chain from Parquet to CloudKitty's
// bill, every part real. Projects A and B: the collector output of
// internal/testkit/billingdata (two projects; same_tenant, shared,
// external over two external networks, infra, an LB), published for hour
// H by billing/usage (audit gate, exact totals, remote write to
// Prometheus) with this package as its Corrector. Project C: an hour of
// totals above 1e9 written through billing/promwrite as usage would, to
// show metrics.yml's split. CloudKitty's processor rates H; GET
// /v2/summary must give every (project, zone, external network) its exact
// bytes and bytes x price. Then a late file for A (usage publishes the
// differences and calls the Corrector: POST /v2/task/reprocesses) and a
// correction for C; after CloudKitty's reprocess the summary follows.
func TestCloudKittyRatesExactHour(t *testing.T) {
	dir, env := testbedEnv(t)
	for _, k := range []string{"OS_AUTH_URL", "OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME", "OS_USER_DOMAIN_ID", "OS_PROJECT_DOMAIN_ID", "OS_REGION_NAME"} {
		t.Setenv(k, env[k])
	}
	t.Setenv("OS_CLOUD", "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()

	// Keystone: three projects billed by CloudKitty (its keystone fetcher
	// rates projects where its user holds the rating role).
	pc, eo, err := openstack.Session(ctx, openstack.Config{Interface: "internal", Timeout: 60_000_000_000})
	if err != nil {
		t.Fatal(err)
	}
	ident, err := gopenstack.NewIdentityV3(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	ckUser := lookupID(t, ctx, ident, "user", "cloudkitty")
	ratingRole := lookupID(t, ctx, ident, "role", "rating")
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	names := map[string]string{}
	var ids []string
	for _, n := range []string{"A", "B", "C"} {
		var id string
		keystoneWrite(t, dir, env["KEYSTONE_URL"], "create project "+n, func() error {
			p, err := projects.Create(ctx, ident, projects.CreateOpts{Name: "tapflow-kitty-" + n + "-" + suffix, DomainID: "default"}).Extract()
			if err == nil {
				id = p.ID
			}
			return err
		})
		keystoneWrite(t, dir, env["KEYSTONE_URL"], "grant rating on "+n, func() error {
			return roles.Assign(ctx, ident, ratingRole, roles.AssignOpts{UserID: ckUser, ProjectID: id}).ExtractErr()
		})
		names[id] = n
		ids = append(ids, id)
	}
	pA, pB, pC := ids[0], ids[1], ids[2]

	// Prices: the shipped example script, for billingdata's two external networks.
	hm := exec.CommandContext(ctx, filepath.Join(deployCK, "hashmap-example.sh"))
	hm.Env = append(os.Environ(), "CLOUDKITTY_URL="+env["CLOUDKITTY_URL"],
		"ZONE_PRICES="+kv(zonePrices), "EXTERNAL_PRICES="+kv(externalPrices))
	if out, err := hm.CombinedOutput(); err != nil {
		t.Fatalf("hashmap-example.sh: %v\n%s", err, out)
	} else {
		t.Logf("hashmap-example.sh:\n%s", out)
	}

	c, err := cloudkitty.New(cloudkitty.Config{Interface: "internal"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// The hour: it started three hours ago, so CloudKitty (wait_periods 2:
	// period P is rated after P+2h) rates it and the next one, and a
	// reprocess of it is allowed (CloudKitty reprocesses only up to a
	// scope's last rated period).
	hour := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)

	// A and B: Parquet as the collector writes it, their Keystone IDs as tenants.
	tenants := map[string]string{billingdata.ProjectA: pA, billingdata.ProjectB: pB}
	data := t.TempDir()
	gen := func(spec billingdata.Spec) []schemas.Flow {
		d := billingdata.Generate(spec)
		for i := range d.Flows {
			d.Flows[i].TenantID = tenants[d.Flows[i].TenantID]
		}
		if err := billingdata.Write(ctx, data, d, nil); err != nil {
			t.Fatal(err)
		}
		return d.Flows
	}
	flows := gen(billingdata.Spec{Start: hour.Add(-10 * time.Minute), Span: time.Hour + 20*time.Minute})
	cfg, err := config.Parse([]byte(fmt.Sprintf("data_dir: %s\nbilling:\n  prometheus:\n    url: %s/api/v1/write\n", data, env["PROMETHEUS_URL"])))
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
	pub, err := usage.New(usage.Options{Output: out, Writer: w, StateDir: u.StateDir, Settle: u.Settle.D(), Lookback: u.Lookback.D(), Corrector: c, RatedAfter: u.RatedAfter.D()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if o, err := pub.Hour(ctx, hour); err != nil || o.Action != usage.ActPublished {
		t.Fatalf("usage: publishing %s: %+v, %v", hour.Format("2006-01-02T15"), o, err)
	}

	// C: large totals, revision 0 as usage writes it.
	bigC := bigTraffic(0)
	if err := w.Write(ctx, promSeries(pC, hour, 0, bigC)); err != nil {
		t.Fatal(err)
	}

	// Start rating at the hour: CloudKitty would begin at the month's
	// start; its processor reads scopes and sleeps a period per pass, so
	// it is restarted after the scopes are set.
	service(t, dir, "stop", "cloudkitty-processor")
	for _, id := range ids {
		out, err := exec.CommandContext(ctx, "/usr/bin/python3", filepath.Join(scripts, "lib", "cloudkitty_scope.py"),
			env["CLOUDKITTY_CONF"], id, hour.Add(-time.Hour).Format(time.RFC3339)).CombinedOutput()
		if err != nil {
			t.Fatalf("cloudkitty_scope.py: %v\n%s", err, out)
		}
	}
	service(t, dir, "start", "cloudkitty-processor")
	waitRated(t, ctx, c, ids, hour.Add(time.Hour))
	t.Logf("CloudKitty rated the hour %s after %s", hour.Format("2006-01-02T15"), time.Since(start).Round(time.Second))

	want := func(flows []schemas.Flow, big []series) map[rowKey]*expectation {
		all := map[string][]series{pC: big}
		for _, tot := range billingdata.Expected(flows, hour) {
			all[tot.Project] = append(all[tot.Project], series{tot.Zone, tot.Direction, tot.ExternalNetwork, tot.LB, tot.Bytes})
		}
		return expected(t, all)
	}
	exp := want(flows, bigC)
	table, bad := compare(t, names, exp, rated(t, ctx, c, hour, ids))
	t.Logf("CloudKitty GET /v2/summary for %s vs tapflow's exact hour (bytes; price = bytes x price per GB / 1e9):\n%s", hour.Format("2006-01-02T15Z"), table)
	if bad > 0 {
		t.Fatalf("%d row(s) differ", bad)
	}

	// Corrections. A: a late file (another agent, project A's VM) in H;
	// usage publishes the differences and calls the Corrector, which asks
	// CloudKitty to reprocess A's hour. C: its public egress grows by
	// 1,000,000,007 bytes (crossing a 1e9 boundary), revision 1.
	corrStart := time.Now()
	flows = append(flows, gen(billingdata.Spec{Start: hour.Add(20 * time.Minute), Span: 10 * time.Minute, Nodes: 1, Taps: 1, First: 3, Seed: 2})...)
	if o, err := pub.Hour(ctx, hour); err != nil || o.Action != usage.ActCorrected {
		t.Fatalf("usage: the late file: %+v, %v", o, err)
	}
	corr := []series{{"external", "egress", billingdata.External1, "none", 1_000_000_007}}
	if err := w.Write(ctx, promSeries(pC, hour, 1, corr)); err != nil {
		t.Fatal(err)
	}
	if err := c.Corrected(ctx, hour, []string{pC}); err != nil {
		t.Fatal(err)
	}
	// Told again before CloudKitty ran it: the pending schedule covers it
	// (CloudKitty would refuse an overlapping one).
	if err := c.Corrected(ctx, hour, []string{pC}); err != nil {
		t.Fatalf("a second correction while the reprocess is pending: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.Collectors()...)
	for result, want := range map[string]float64{"scheduled": 2, "already_scheduled": 1, "not_rated_yet": 2, "failed": 0} {
		if got := counterValue(t, reg, result); got != want {
			t.Errorf("tapflow_billing_cloudkitty_reprocess_projects_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	bigC = append(bigC, corr...)
	// CloudKitty's reprocessor picks schedules up on its next pass, one
	// period (an hour) later: restart it so that pass is now.
	service(t, dir, "stop", "cloudkitty-processor")
	service(t, dir, "start", "cloudkitty-processor")
	exp = want(flows, bigC)
	waitFor(t, 8*time.Minute, "the reprocessed summary", func() (bool, string) {
		got := rated(t, ctx, c, hour, ids)
		_, bad := compare(t, names, exp, got)
		return bad == 0, fmt.Sprintf("%d rows differ", bad)
	})
	table, _ = compare(t, names, exp, rated(t, ctx, c, hour, ids))
	t.Logf("after the late file (A), a correction (C) and POST /v2/task/reprocesses (%s):\n%s", time.Since(corrStart).Round(time.Second), table)
	t.Logf("total %s", time.Since(start).Round(time.Second))
}

// counterValue is the hook's counter for result, read back from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series with result %q", result)
	return 0
}

// promSeries is revision rev of hour h for project p, as billing/usage
// writes it (usage.SampleTime).
func promSeries(p string, h time.Time, rev int, ss []series) []promwrite.Series {
	var out []promwrite.Series
	for _, s := range ss {
		out = append(out, promwrite.NewSeries(usage.BytesMetric, []promwrite.Label{
			{Name: "project_id", Value: p}, {Name: "zone", Value: s.zone}, {Name: "direction", Value: s.direction},
			{Name: "external_network", Value: s.extnet}, {Name: "lb_id", Value: s.lb},
		}, promwrite.Sample{Value: float64(s.bytes), TimestampMs: usage.SampleTime(h, rev)}))
	}
	return out
}

// waitRated waits until CloudKitty rated every scope up to (the period
// starting at) until.
func waitRated(t *testing.T, ctx context.Context, c *cloudkitty.Client, ids []string, until time.Time) {
	t.Helper()
	waitFor(t, 8*time.Minute, "CloudKitty's processor to rate the hour", func() (bool, string) {
		scopes, err := c.Scopes(ctx, ids)
		if err != nil {
			return false, err.Error()
		}
		done := 0
		var state []string
		for _, s := range scopes {
			state = append(state, s.ID+"@"+s.RawLast)
			if slices.Contains(ids, s.ID) && !s.LastProcessed.Before(until) {
				done++
			}
		}
		return done == len(ids), strings.Join(state, " ")
	})
}

func kv(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func lookupID(t *testing.T, ctx context.Context, ident *gophercloud.ServiceClient, kind, name string) string {
	t.Helper()
	var id string
	var err error
	switch kind {
	case "user":
		var all []users.User
		pages, perr := users.List(ident, users.ListOpts{Name: name}).AllPages(ctx)
		if err = perr; err == nil {
			all, err = users.ExtractUsers(pages)
			if len(all) > 0 {
				id = all[0].ID
			}
		}
	case "role":
		var all []roles.Role
		pages, perr := roles.List(ident, roles.ListOpts{Name: name}).AllPages(ctx)
		if err = perr; err == nil {
			all, err = roles.ExtractRoles(pages)
			if len(all) > 0 {
				id = all[0].ID
			}
		}
	}
	if err == nil && id == "" {
		err = errors.New("not found (cloudkitty-up.sh creates it)")
	}
	if err != nil {
		t.Fatalf("keystone %s %q: %v", kind, name, err)
	}
	return id
}
