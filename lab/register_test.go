package lab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	testbed "github.com/tapflow/tapflow/deploy/openstack-testbed"
	"github.com/tapflow/tapflow/lab"
)

// The register tests run `lab up --register` against the real Keystone,
// Neutron, Nova and Octavia of deploy/openstack-testbed:
//
//   - TAPFLOW_OPENSTACK_STATE=DIR uses a testbed started with up.sh DIR
//     (make test-openstack starts one for this package and the contract
//     tests);
//   - TAPFLOW_OPENSTACK=1 starts one for this test (root, packages
//     installed: deploy/openstack-testbed/install.sh);
//   - otherwise they skip, saying so.

// testbedEnv returns the testbed's env file (endpoints and admin
// credentials), starting a testbed when asked to.
func testbedEnv(t *testing.T) map[string]string {
	t.Helper()
	dir := os.Getenv("TAPFLOW_OPENSTACK_STATE")
	scripts, _ := filepath.Abs(filepath.Join("..", "deploy", "openstack-testbed"))
	if dir == "" {
		if os.Getenv("TAPFLOW_OPENSTACK") != "1" {
			// deliberate skip: opt-in, make test-openstack runs it against a testbed it starts.
			t.Skip("register test: set TAPFLOW_OPENSTACK_STATE to a running deploy/openstack-testbed, or TAPFLOW_OPENSTACK=1 (root) to start one; `make test-openstack` does")
		}
		if out, err := exec.Command(filepath.Join(scripts, "install.sh"), "--check").CombinedOutput(); err != nil {
			t.Fatalf("openstack testbed not installed: %s(run %s/install.sh as root)", out, scripts)
		}
		dir = t.TempDir()
		up := exec.Command(filepath.Join(scripts, "up.sh"), dir)
		if out, err := up.CombinedOutput(); err != nil {
			t.Fatalf("testbed up.sh: %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command(filepath.Join(scripts, "down.sh"), dir).Run() })
	}
	env, err := testbed.ReadEnv(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatalf("TAPFLOW_OPENSTACK_STATE=%s: %v (start it with %s/up.sh %s)", dir, err, scripts, dir)
	}
	return env
}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Auth-Token", "testbed")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
	return resp.StatusCode
}

// TestRegisterScenario builds the Octavia acceptance scenario's cloud in
// the real APIs, captures with tapflow reading its inventory from them
// (inventory.provider openstack through Keystone), and checks the seed's
// table and conservation; then that every tap is a Neutron port with the
// tap's MAC, that the amphorae are Octavia's, and that down deletes all
// of it.
func TestRegisterScenario(t *testing.T) {
	requireLab(t)
	env := testbedEnv(t)
	for _, k := range []string{"OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME", "OS_USER_DOMAIN_ID", "OS_PROJECT_DOMAIN_ID", "OS_REGION_NAME"} {
		t.Setenv(k, env[k]) // lab down (also the cleanup's) reads them
	}
	sc, err := lab.LoadScenario(labfiles.FS, "scenarios/octavia-lb-attribution.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := self(t)
	p, state := prefix(t), filepath.Join(t.TempDir(), "state")
	t.Cleanup(func() { lab.Teardown(context.Background(), p, state, nil) }) // deletes the OpenStack objects if the test stops early
	start := time.Now()
	out, err := lab.RunScenario(ctx, sc, lab.RunOptions{Prefix: p, StateDir: state, Helper: cmd, Tapflow: cmd,
		DataDir: t.TempDir(), Logger: testLogger(t), Keep: true,
		Register: &lab.RegisterOptions{AuthURL: env["OS_AUTH_URL"], NovaConf: env["NOVA_CONF"]}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	out.Print(&buf)
	t.Log(buf.String())
	if n := out.Failed(); n > 0 {
		t.Errorf("%d check(s) failed (see the table and checks above)", n)
	}
	cfg, _ := os.ReadFile(filepath.Join(out.DataDir, "tapflow.yaml"))
	if !strings.Contains(string(cfg), "provider: openstack") {
		t.Errorf("tapflow ran without the openstack provider:\n%s", cfg)
	}
	if out.Conservation.Unattributed > 0 {
		t.Errorf("%d records with metadata_version 0", out.Conservation.Unattributed)
	}

	// Every tap is the Neutron port of the same id and MAC.
	c := out.Cloud
	neutron, octavia := env["NEUTRON_URL"]+"/v2.0", env["OCTAVIA_URL"]+"/v2"
	var created []string
	for _, tp := range c.Taps() {
		var got struct {
			Port struct {
				MAC       string `json:"mac_address"`
				DeviceID  string `json:"device_id"`
				NetworkID string `json:"network_id"`
			} `json:"port"`
		}
		if code := getJSON(t, neutron+"/ports/"+tp.ID, &got); code != 200 {
			t.Errorf("tap %s: Neutron port %s: HTTP %d", tp.HostDev, tp.ID, code)
			continue
		}
		if got.Port.MAC != tp.MAC.String() || got.Port.NetworkID != tp.Net.ID || got.Port.DeviceID != tp.DeviceID {
			t.Errorf("tap %s: Neutron has mac %s net %s device %s, the lab %s %s %s", tp.HostDev,
				got.Port.MAC, got.Port.NetworkID, got.Port.DeviceID, tp.MAC, tp.Net.ID, tp.DeviceID)
		}
		if !strings.HasPrefix(tp.HostDev, "tap"+tp.ID[:11]) {
			t.Errorf("tap %s is not named after its port %s", tp.HostDev, tp.ID)
		}
		created = append(created, tp.ID)
	}
	lb := c.LB("web-lb")
	var amps struct {
		Amphorae []struct {
			ID        string `json:"id"`
			ComputeID string `json:"compute_id"`
		} `json:"amphorae"`
	}
	getJSON(t, octavia+"/octavia/amphorae?loadbalancer_id="+lb.ID, &amps)
	if len(amps.Amphorae) != 2 {
		t.Errorf("Octavia lists %d amphorae of %s, want 2", len(amps.Amphorae), lb.ID)
	}
	for _, a := range lb.Amphorae {
		found := false
		for _, o := range amps.Amphorae {
			found = found || (o.ID == a.ID && o.ComputeID == a.ComputeID)
		}
		if !found {
			t.Errorf("lab amphora %s (%s, compute %s) is not Octavia's", a.Name, a.ID, a.ComputeID)
		}
	}

	// A second process finds the registered lab through its state.
	l, err := lab.Open(lab.Options{Prefix: p, StateDir: state, Helper: cmd})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Registered() || l.Cloud.LB("web-lb").ID != lb.ID || l.Cloud.Taps()[0].HostDev != c.Taps()[0].HostDev {
		t.Errorf("Open did not re-bind the registered cloud: lb %s, tap %s", l.Cloud.LB("web-lb").ID, l.Cloud.Taps()[0].HostDev)
	}
	if err := l.SetPresent("web1", false); err == nil {
		t.Error("SetPresent on a registered lab: no error (its inventory comes from OpenStack)")
	}

	// down deletes what it created.
	if err := l.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range created {
		if code := getJSON(t, neutron+"/ports/"+id, nil); code != 404 {
			t.Errorf("port %s after lab down: HTTP %d, want 404", id, code)
		}
	}
	if code := getJSON(t, octavia+"/lbaas/loadbalancers/"+lb.ID, nil); code != 404 {
		var st struct {
			LB struct {
				Status string `json:"provisioning_status"`
			} `json:"loadbalancer"`
		}
		getJSON(t, octavia+"/lbaas/loadbalancers/"+lb.ID, &st)
		if st.LB.Status != "DELETED" {
			t.Errorf("load balancer %s after lab down: HTTP %d %s", lb.ID, code, st.LB.Status)
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state directory left: %v", err)
	}
	t.Logf("register scenario: %s (lab up incl. registration %s)", time.Since(start).Round(time.Second), out.UpTime.Round(time.Second))
}

// TestRegisterBadCredentials: a wrong password fails before anything is
// created, naming the credentials; nothing is left behind.
func TestRegisterBadCredentials(t *testing.T) {
	requireLab(t)
	env := testbedEnv(t)
	t.Setenv("OS_USERNAME", env["OS_USERNAME"])
	t.Setenv("OS_PASSWORD", "wrong-"+env["OS_PASSWORD"])
	t.Setenv("OS_PROJECT_NAME", env["OS_PROJECT_NAME"])
	data, _ := fs.ReadFile(labfiles.FS, "basic.yaml")
	p, state := prefix(t), filepath.Join(t.TempDir(), "state")
	l, err := lab.New(data, "basic.yaml", lab.Options{Prefix: p, StateDir: state, Helper: self(t), Logger: testLogger(t),
		Register: &lab.RegisterOptions{AuthURL: env["OS_AUTH_URL"]}})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Up(context.Background())
	if err == nil || !strings.Contains(err.Error(), "OS_* credentials") {
		t.Fatalf("Up with a wrong password = %v, want an authentication error naming the credentials", err)
	}
	if ns, _ := lab.ListNamespaces(p); len(ns) > 0 {
		t.Errorf("namespaces left: %v", ns)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state directory left: %v", err)
	}
}
