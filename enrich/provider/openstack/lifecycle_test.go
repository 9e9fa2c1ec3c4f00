package openstack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/enrich"
	"github.com/tapflow/tapflow/enrich/provider/openstack"
	"github.com/tapflow/tapflow/enrich/snapshot"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/inventory"
)

// TestContractPagination: pages of 2 drain to the same inventory as
// pages of 1000 (Neutron, Nova and Octavia next links, Octavia dropping
// fields= from them).
func TestContractPagination(t *testing.T) {
	b, _ := needTopology(t)
	big, _, _ := newProvider(t, noauthConfig(b))
	small := noauthConfig(b)
	small.PageSize = 2
	sp, _, _ := newProvider(t, small)
	want, got := reconcile(t, big), reconcile(t, sp)
	if len(want.Ports) < 10 || len(want.Servers) < 3 || len(want.Amphorae) < 2 {
		t.Fatalf("too small to page: %d ports, %d servers, %d amphorae", len(want.Ports), len(want.Servers), len(want.Amphorae))
	}
	if !reflect.DeepEqual(want, got) {
		for coll, n := range map[string][2]int{"ports": {len(want.Ports), len(got.Ports)}, "servers": {len(want.Servers), len(got.Servers)},
			"amphorae": {len(want.Amphorae), len(got.Amphorae)}, "loadbalancers": {len(want.LoadBalancers), len(got.LoadBalancers)}} {
			t.Logf("%s: %d vs %d", coll, n[0], n[1])
		}
		t.Fatal("pages of 2 and pages of 1000 read different inventories")
	}
}

// TestContractGhostWindow: a port deleted in Neutron keeps attributing for
// the ghost grace, then is gone.
func TestContractGhostWindow(t *testing.T) {
	b, x := needTopology(t)
	nu := b.env["NEUTRON_URL"] + "/v2.0"
	mac := fmt.Sprintf("fa:16:3e:%s:%s:77", x.sfx[0:2], x.sfx[2:4])
	var out struct{ Port struct{ ID string } }
	api(t, "POST", nu+"/ports", nil, map[string]any{"port": map[string]any{"name": "ghost", "network_id": x.app, "project_id": x.p1,
		"mac_address": mac, "device_owner": "compute:nova", "device_id": uuidish()}}, 201, &out)

	p, _, _ := newProvider(t, noauthConfig(b))
	const grace = 2 * time.Second
	cfg := enrich.DefaultConfig()
	cfg.GhostGrace = units.Duration(grace)
	eng, err := enrich.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), enrich.WithProvider(p))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := eng.Load(ctx); err != nil { // cold start through Poll
		t.Fatal(err)
	}
	m := mustMAC(t, mac)
	ep, ok := eng.Snapshot().Endpoint(m, time.Now().UnixMicro())
	if !ok || ep.PortID != out.Port.ID || ep.DeleteAtUS != 0 {
		t.Fatalf("before delete: %+v %v", ep, ok)
	}
	v := eng.Snapshot().Version()

	api(t, "DELETE", nu+"/ports/"+out.Port.ID, nil, nil, 204, nil)
	reconcile(t, p)
	if err := eng.Load(ctx); err != nil {
		t.Fatal(err)
	}
	s := eng.Snapshot()
	if s.Version() == v {
		t.Fatal("the deletion did not produce a new snapshot")
	}
	ep, ok = s.Endpoint(m, time.Now().UnixMicro())
	if !ok || ep.DeleteAtUS == 0 || ep.TenantID != x.p1 {
		t.Fatalf("deleted port right after the pass: %+v %v, want a ghost of %s", ep, ok, x.p1)
	}
	time.Sleep(grace + 100*time.Millisecond)
	if err := eng.Load(ctx); err != nil { // nothing changed: rebuild drops expired ghosts
		t.Fatal(err)
	}
	if ep, ok := eng.Snapshot().Endpoint(m, time.Now().UnixMicro()); ok {
		t.Fatalf("after the grace: still %+v", ep)
	}
	if st := eng.Snapshot().Stats(); st.Ghosts != 0 {
		t.Errorf("ghosts %d after the grace", st.Ghosts)
	}
}

// TestContractNeutronOutage: with Neutron stopped a pass fails, the last
// inventory (and the engine's snapshot) stays, the error is counted and
// reported once; a cold start waits, saying for what; both recover when
// Neutron is back.
func TestContractNeutronOutage(t *testing.T) {
	b, _ := needTopology(t)
	p, reg, _ := newProvider(t, noauthConfig(b))
	eng, err := enrich.New(enrich.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry(), enrich.WithProvider(p))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := eng.Load(ctx); err != nil {
		t.Fatal(err)
	}
	before, at := p.Inventory()
	version := eng.Snapshot().Version()

	b.service(t, "stop", "neutron-server")
	restarted := false
	restart := func() {
		if !restarted {
			restarted = true
			b.service(t, "start", "neutron-server")
			waitHTTP(t, b.env["NEUTRON_URL"]+"/v2.0/networks", 2*time.Minute)
		}
	}
	t.Cleanup(restart)

	err = p.Reconcile(ctx)
	var fe *openstack.FetchError
	if !errors.As(err, &fe) || fe.Code != "network" || !strings.Contains(err.Error(), "cannot reach Neutron") {
		t.Fatalf("pass with Neutron down: %v, want a network FetchError naming Neutron", err)
	}
	if n := metricValue(t, reg, "tapflow_inventory_errors_total", "code", "network"); n < 1 {
		t.Errorf("network errors counted: %v", n)
	}
	if n := metricValue(t, reg, "tapflow_inventory_passes_total", "result", "error"); n != 1 {
		t.Errorf("failed passes: %v, want 1", n)
	}
	after, at2 := p.Inventory()
	if after != before || !at2.Equal(at) {
		t.Error("the failed pass replaced the inventory")
	}
	if err := eng.Load(ctx); err == nil || eng.Snapshot().Version() != version {
		t.Errorf("engine: err %v, version %d -> %d; want the error once and the old snapshot", err, version, eng.Snapshot().Version())
	}
	if err := eng.Load(ctx); err != nil {
		t.Errorf("engine: the same failure reported twice: %v", err)
	}
	if age := metricValue(t, reg, "tapflow_inventory_age_seconds"); age < 0 {
		t.Errorf("age %v while serving the last inventory", age)
	}

	// A cold start now blocks (capture would stay detached) and says why.
	coldCfg := noauthConfig(b)
	coldCfg.Timeout = units.Duration(5 * time.Second) // a restarting Neutron may accept and not answer yet
	cold, coldReg, coldLog := newProvider(t, coldCfg, openstack.WithBackoff(100*time.Millisecond, 400*time.Millisecond))
	if age := metricValue(t, coldReg, "tapflow_inventory_age_seconds"); age != -1 {
		t.Errorf("age before any pass: %v, want -1", age)
	}
	type res struct {
		inv     *inventory.Inventory
		changed bool
		err     error
	}
	done := make(chan res, 1)
	go func() {
		inv, ch, err := cold.Poll(ctx)
		done <- res{inv, ch, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(coldLog.String(), "waiting for the first complete OpenStack inventory") {
		if time.Now().After(deadline) {
			t.Fatalf("no cold-start wait logged: %s", coldLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("Poll returned while Neutron is down: %+v", r)
	default:
	}
	if !strings.Contains(coldLog.String(), "Neutron networks, subnets, ports") || !strings.Contains(coldLog.String(), "retry_in") {
		t.Errorf("the wait log does not say what it waits for: %s", coldLog)
	}

	restart()
	select {
	case r := <-done:
		if r.err != nil || !r.changed || len(r.inv.Ports) != len(before.Ports) {
			t.Fatalf("cold start after recovery: changed %v, err %v", r.changed, r.err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("cold start did not complete after Neutron came back: %s", coldLog)
	}
	if err := p.Reconcile(ctx); err != nil {
		t.Fatalf("pass after recovery: %v", err)
	}
	if _, at3 := p.Inventory(); !at3.After(at) {
		t.Error("recovery pass did not refresh the inventory time")
	}
	if age := metricValue(t, reg, "tapflow_inventory_age_seconds"); age < 0 || age > 5 {
		t.Errorf("age after recovery: %v", age)
	}
}

// proxy is a reverse proxy in front of a real API that can break the
// answers to one path.
type proxy struct {
	srv  *httptest.Server
	mode atomic.Value // string: "", "invalid-json", "drop-field:NAME", "status:CODE"
	path string       // the path whose answers are broken
}

func newProxy(t *testing.T, target, path string) *proxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{path: path}
	px.mode.Store("")
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	rp.ModifyResponse = func(r *http.Response) error {
		mode := px.mode.Load().(string)
		if mode == "" || !strings.HasSuffix(r.Request.URL.Path, px.path) {
			return nil
		}
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return err
		}
		switch {
		case mode == "invalid-json":
			body = body[:len(body)/2]
		case strings.HasPrefix(mode, "drop-field:"):
			// remove the field from every object of every list
			var top map[string]any
			if err := json.Unmarshal(body, &top); err != nil {
				return err
			}
			for _, v := range top {
				if objs, ok := v.([]any); ok {
					for _, o := range objs {
						if m, ok := o.(map[string]any); ok {
							delete(m, strings.TrimPrefix(mode, "drop-field:"))
						}
					}
				}
			}
			if body, err = json.Marshal(top); err != nil {
				return err
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Del("Content-Length")
		return nil
	}
	px.srv = httptest.NewServer(rp)
	t.Cleanup(px.srv.Close)
	return px
}

// TestContractBadResponses: invalid JSON or a missing field from Neutron
// fails the pass with an error naming the collection, the problem and the
// fix, and keeps the previous inventory; the same from Nova keeps the
// previous servers and the pass completes.
func TestContractBadResponses(t *testing.T) {
	b, _ := needTopology(t)
	neutron := newProxy(t, b.env["NEUTRON_URL"], "/v2.0/ports")
	nova := newProxy(t, b.env["NOVA_URL"], "/servers/detail")
	cfg := noauthConfig(b)
	cfg.NoAuth.Neutron = neutron.srv.URL
	cfg.NoAuth.Nova = nova.srv.URL + "/v2.1"
	p, reg, logs := newProvider(t, cfg)
	good := reconcile(t, p)
	ctx := context.Background()

	for _, c := range []struct {
		mode string
		want []string
	}{
		{"invalid-json", []string{"openstack ports: GET " + neutron.srv.URL, "invalid JSON", "check the endpoint URL"}},
		{"drop-field:mac_address", []string{"openstack ports", "missing field mac_address", "Neutron"}},
		{"drop-field:device_owner", []string{"missing field device_owner"}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			neutron.mode.Store(c.mode)
			defer neutron.mode.Store("")
			before := metricValue(t, reg, "tapflow_inventory_errors_total", "endpoint", "ports", "code", "decode")
			err := p.Reconcile(ctx)
			if err == nil {
				t.Fatal("a broken ports answer passed")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if inv, _ := p.Inventory(); inv != good {
				t.Error("the previous inventory was replaced")
			}
			if n := metricValue(t, reg, "tapflow_inventory_errors_total", "endpoint", "ports", "code", "decode"); n != before+1 {
				t.Errorf("ports/decode errors %v -> %v", before, n)
			}
		})
	}

	t.Run("nova invalid JSON is best effort", func(t *testing.T) {
		nova.mode.Store("invalid-json")
		defer nova.mode.Store("")
		if err := p.Reconcile(ctx); err != nil {
			t.Fatalf("a broken Nova answer failed the pass: %v", err)
		}
		inv, _ := p.Inventory()
		if !reflect.DeepEqual(inv.Servers, good.Servers) || len(inv.Servers) == 0 {
			t.Errorf("servers not kept: %d vs %d", len(inv.Servers), len(good.Servers))
		}
		if v := metricValue(t, reg, "tapflow_inventory_stale", "collection", "servers"); v != 1 {
			t.Errorf("servers stale gauge %v", v)
		}
		if !strings.Contains(logs.String(), "best-effort collection failed") || !strings.Contains(logs.String(), "collection=servers") {
			t.Errorf("not reported: %s", logs)
		}
	})
	if err := p.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, reg, "tapflow_inventory_stale", "collection", "servers"); v != 0 {
		t.Errorf("servers stale after recovery: %v", v)
	}
}

// TestContractKeystone: password, application credential, token and
// clouds.yaml auth against the real Keystone, the catalog's interfaces,
// projects, and no secret in errors or logs.
func TestContractKeystone(t *testing.T) {
	b, x := needTopology(t)
	ks := b.env["KEYSTONE_URL"]
	tok := b.adminToken(t)
	var me struct {
		Token struct{ User struct{ ID string } }
	}
	api(t, "GET", ks+"/v3/auth/tokens", map[string]string{"X-Auth-Token": tok, "X-Subject-Token": tok}, nil, 200, &me)
	secret := "appcred-" + randHex(8)
	var ac struct {
		ApplicationCredential struct{ ID string } `json:"application_credential"`
	}
	api(t, "POST", ks+"/v3/users/"+me.Token.User.ID+"/application_credentials", map[string]string{"X-Auth-Token": tok},
		map[string]any{"application_credential": map[string]any{"name": "tapflow-" + randHex(4), "secret": secret}}, 201, &ac)

	env := func(over map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := over[k]; ok {
				return v
			}
			if strings.HasPrefix(k, "OS_") {
				return b.env[k]
			}
			return ""
		}
	}
	base := map[string]string{}
	appcred := map[string]string{"OS_USERNAME": "", "OS_PASSWORD": "", "OS_PROJECT_NAME": "",
		"OS_APPLICATION_CREDENTIAL_ID": ac.ApplicationCredential.ID, "OS_APPLICATION_CREDENTIAL_SECRET": secret}
	token := map[string]string{"OS_USERNAME": "", "OS_PASSWORD": "", "OS_TOKEN": b.adminToken(t)}

	dir := t.TempDir()
	clouds := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(clouds, []byte(fmt.Sprintf(`clouds:
  testbed:
    auth_type: v3applicationcredential
    auth:
      auth_url: %s/v3
      application_credential_id: %s
      application_credential_secret: %s
    region_name: RegionOne
    interface: public
`, ks, ac.ApplicationCredential.ID, secret)), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name    string
		env     map[string]string
		cfg     func(*openstack.Config)
		secrets []string
	}{
		{"password", base, nil, []string{b.env["OS_PASSWORD"]}},
		{"application credential", appcred, nil, []string{secret}},
		{"token", token, nil, []string{token["OS_TOKEN"]}},
		{"clouds.yaml", map[string]string{"OS_AUTH_URL": ""}, func(c *openstack.Config) { c.Cloud, c.CloudsFile = "testbed", clouds }, []string{secret}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := openstack.DefaultConfig()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			p, reg, logs := newProvider(t, cfg, openstack.WithGetenv(env(c.env)))
			inv := reconcile(t, p)
			names := map[string]string{}
			for _, pr := range inv.Projects {
				names[pr.ID] = pr.Name
			}
			if names[x.p1] != x.p1Name || names[x.p2] != x.p2Name {
				t.Errorf("projects: %v lacks %s=%s, %s=%s", names, x.p1, x.p1Name, x.p2, x.p2Name)
			}
			if len(inv.Ports) < 10 || len(inv.Amphorae) < 2 {
				t.Errorf("%d ports, %d amphorae through the catalog's internal endpoints", len(inv.Ports), len(inv.Amphorae))
			}
			// Nova's noauth2 makes a Keystone token a non-admin user: all_tenants is
			// refused, which is best effort.
			if n := metricValue(t, reg, "tapflow_inventory_errors_total", "endpoint", "servers", "code", "403"); n != 1 {
				t.Errorf("servers 403 counted %v times", n)
			}
			for _, s := range c.secrets {
				if strings.Contains(logs.String(), s) {
					t.Errorf("a secret is in the log")
				}
			}
			if strings.Contains(p.Source(), secret) || strings.Contains(p.Source(), b.env["OS_PASSWORD"]) {
				t.Errorf("Source() shows a secret: %s", p.Source())
			}
		})
	}

	t.Run("public interface is a closed port", func(t *testing.T) {
		cfg := openstack.DefaultConfig()
		cfg.Interface = "public"
		p, _, _ := newProvider(t, cfg, openstack.WithGetenv(env(base)))
		err := p.Reconcile(context.Background())
		if err == nil || !strings.Contains(err.Error(), "interface public") || !strings.Contains(err.Error(), "cannot reach Neutron") {
			t.Fatalf("public interface: %v", err)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		wrong := "wrong-" + randHex(8)
		p, reg, logs := newProvider(t, openstack.DefaultConfig(), openstack.WithGetenv(env(map[string]string{"OS_PASSWORD": wrong})))
		err := p.Reconcile(context.Background())
		if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "credentials were refused") {
			t.Fatalf("wrong password: %v", err)
		}
		if strings.Contains(err.Error(), wrong) || strings.Contains(logs.String(), wrong) {
			t.Error("the password is in the error or the log")
		}
		if n := metricValue(t, reg, "tapflow_inventory_errors_total", "endpoint", "keystone", "code", "401"); n != 1 {
			t.Errorf("keystone 401 counted %v", n)
		}
	})
}

// TestContractDump: Dump writes the static file format; it parses back to
// what the provider holds.
func TestContractDump(t *testing.T) {
	b, x := needTopology(t)
	var out bytes.Buffer
	if err := openstack.Dump(context.Background(), noauthConfig(b), nil, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "# tapflow inventory dump: noauth") {
		t.Errorf("header: %.100s", out.String())
	}
	got, err := inventory.Parse(out.Bytes(), "dump")
	if err != nil {
		t.Fatalf("dump does not parse as an inventory file: %v", err)
	}
	p, _, _ := newProvider(t, noauthConfig(b))
	want := reconcile(t, p)
	if !reflect.DeepEqual(normalize(got), normalize(want)) {
		t.Fatal("dump and provider inventories differ")
	}
	s := snapshot.Build(got, snapshot.Options{Version: 1, Now: time.Now()})
	if ep, ok := s.Endpoint(mustMAC(t, x.vm1MAC), time.Now().UnixMicro()); !ok || ep.TenantID != x.p1 {
		t.Errorf("replayed dump: vm1 %+v %v", ep, ok)
	}
}

// normalize makes nil and empty slices equal (YAML writes [] for both).
func normalize(inv *inventory.Inventory) *inventory.Inventory {
	var buf bytes.Buffer
	if err := openstack.WriteInventory(&buf, inv); err != nil {
		panic(err)
	}
	out, err := inventory.Parse(buf.Bytes(), "normalize")
	if err != nil {
		panic(err)
	}
	return out
}

// TestContractRunRefresh: Run cold-starts, then a Refresh (SIGHUP, HTTP)
// makes it reconcile at once: a network created meanwhile shows up through
// Updates and Poll; Poll reports each inventory once.
func TestContractRunRefresh(t *testing.T) {
	b, x := needTopology(t)
	cfg := noauthConfig(b)
	cfg.Refresh = units.Duration(time.Hour)
	p, reg, _ := newProvider(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-p.Ready():
	case <-time.After(time.Minute):
		t.Fatal("Run did not cold-start")
	}
	if inv, changed, err := p.Poll(ctx); err != nil || !changed || inv == nil {
		t.Fatalf("first Poll: %v %v", changed, err)
	}
	if _, changed, err := p.Poll(ctx); err != nil || changed {
		t.Fatalf("second Poll without a pass: changed %v, err %v", changed, err)
	}
	var out struct{ Network struct{ ID string } }
	api(t, "POST", b.env["NEUTRON_URL"]+"/v2.0/networks", nil, map[string]any{"network": map[string]any{"name": "late-" + x.sfx, "project_id": x.p2}}, 201, &out)
	for len(p.Updates()) > 0 { // drop the cold start's signal
		<-p.Updates()
	}
	p.Refresh()
	select {
	case <-p.Updates():
	case <-time.After(time.Minute):
		t.Fatal("no update after Refresh")
	}
	inv, changed, err := p.Poll(ctx)
	if err != nil || !changed || !slices.ContainsFunc(inv.Networks, func(n inventory.Network) bool { return n.ID == out.Network.ID }) {
		t.Fatalf("after Refresh: changed %v, err %v, new network present %v", changed, err, inv != nil)
	}
	if n := metricValue(t, reg, "tapflow_inventory_passes_total", "result", "ok"); n != 2 {
		t.Errorf("ok passes %v, want 2 (cold start + refresh)", n)
	}
}
