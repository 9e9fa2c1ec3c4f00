package lab_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/lab"
)

// TestRegisterNewVM is issue 13's real-cloud test (make test-openstack):
// a lab VM (basic.yaml's vm3, left out of OpenStack) is already sending
// when its port is created through the Neutron API with the VM's MAC.
// `tapflow inventory serve` reads the real Neutron with the lab's admin
// clouds.yaml; the agent (`tapflow run` in the hypervisor namespace) has
// inventory.provider nats, NATS credentials only, no OpenStack variable
// in its environment and no route to the APIs. Every record of the flow
// must carry the right tenant, server, port and zone, 0 bytes unknown:
// late binding held the VM's records until the agent's targeted lookup
// (inventory.lookup.*) brought the port as a delta.
func TestRegisterNewVM(t *testing.T) {
	requireLab(t)
	env := testbedEnv(t)
	for _, k := range []string{"OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME", "OS_USER_DOMAIN_ID", "OS_PROJECT_DOMAIN_ID", "OS_REGION_NAME"} {
		t.Setenv(k, env[k]) // registration and lab down read them; the agent must not see them
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	data, _ := fs.ReadFile(labfiles.FS, "basic.yaml")
	p, state := prefix(t), filepath.Join(t.TempDir(), "state")
	cmd := self(t)
	l, err := lab.New(data, "basic.yaml", lab.Options{Prefix: p, StateDir: state, Helper: cmd, Logger: testLogger(t),
		Register: &lab.RegisterOptions{AuthURL: env["OS_AUTH_URL"], NovaConf: env["NOVA_CONF"]}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Teardown(context.Background(), p, state, nil) }) // deletes the OpenStack objects if the test stops early
	if err := l.Up(ctx); err != nil {
		t.Fatal(err)
	}
	vm3 := l.Cloud.Server("vm3")
	mac := vm3.Ports[0].MAC.String()
	neutron := env["NEUTRON_URL"] + "/v2.0"
	var before struct {
		Ports []json.RawMessage `json:"ports"`
	}
	if code := getJSON(t, neutron+"/ports?mac_address="+mac, &before); code != 200 || len(before.Ports) != 0 {
		t.Fatalf("vm3's MAC %s in Neutron before the test creates it: HTTP %d, %d ports", mac, code, len(before.Ports))
	}

	// NATS with one user per role: the agent's is all a hypervisor holds.
	dir := t.TempDir()
	secret := func(name string) (pw, file string) {
		b := make([]byte, 12)
		rand.Read(b)
		pw = name + "-" + hex.EncodeToString(b)
		file = filepath.Join(dir, name+".password")
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return pw, file
	}
	agentPW, agentPWFile := secret("agent")
	svcPW, svcPWFile := secret("inventory")
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, JetStream: true,
		StoreDir: filepath.Join(dir, "nats"), MaxPayload: 8 << 20,
		Users: []*server.User{{Username: "agent", Password: agentPW}, {Username: "inventory", Password: svcPW}}})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	natsAddr := ns.Addr().String()

	// The metadata service, on the host: the real Neutron, admin clouds.yaml.
	metrics := freePort(t)
	svcDir := filepath.Join(dir, "serve")
	os.MkdirAll(svcDir, 0o700)
	svcCfg := filepath.Join(svcDir, "tapflow.yaml")
	writeFile(t, svcCfg, fmt.Sprintf(`node: %s-meta
data_dir: %s
inventory:
  provider: openstack
  poll_interval: 200ms
  refresh: 1h          # only the targeted lookup can bring the new port in time
  openstack:
    cloud: lab
    clouds_file: %s
    interface: internal
  lookup:
    window: 1s
    rate: 1
    burst: 5
nats:
  url: nats://%s
  user: inventory
  password_file: %s
metrics:
  listen: %s
log:
  format: json
  level: info
`, p, svcDir, l.CloudsPath(), natsAddr, svcPWFile, metrics))
	svcLog := filepath.Join(svcDir, "serve.log")
	svc, svcDone := startHelper(t, cmd, svcLog, "inventory", "serve", "--config", svcCfg)
	waitLog(t, svcLog, svcDone, "inventory snapshot published", 3*time.Minute)

	// The agent: NATS credentials only, nothing of OpenStack.
	pl, err := l.StartPipeline(ctx, lab.PipelineOptions{Command: cmd, DataDir: filepath.Join(dir, "agent"),
		Inventory:   "  provider: nats\n  poll_interval: 200ms\n  lookup:\n    interval: 3s\n    timeout: 2s\n",
		Forward:     []string{natsAddr},
		ExtraConfig: fmt.Sprintf("nats:\n  url: nats://%s\n  user: agent\n  password_file: %s\n", natsAddr, agentPWFile)})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			pl.Stop(context.Background())
		}
	})
	agentCfg, _ := os.ReadFile(pl.ConfigPath())
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pl.Pid()))
	for _, bad := range []string{env["OS_PASSWORD"], "OS_PASSWORD", "OS_USERNAME", "openstack", "clouds", l.CloudsPath()} {
		if bytes.Contains(agentCfg, []byte(bad)) {
			t.Errorf("agent config holds %q (an OpenStack secret or access)", bad)
		}
	}
	// The environment: no OS_* variable, no password, no clouds.yaml. (Not
	// the word "openstack": the test's own plumbing, TAPFLOW_OPENSTACK and
	// the testbed's state directory, legitimately carries it and is no
	// access to OpenStack.)
	for _, kv := range bytes.Split(environ, []byte{0}) {
		name, value, _ := bytes.Cut(kv, []byte("="))
		switch {
		case bytes.HasPrefix(name, []byte("OS_")):
			t.Errorf("agent environment holds %s (an OpenStack credential variable)", name)
		case env["OS_PASSWORD"] != "" && bytes.Contains(value, []byte(env["OS_PASSWORD"])):
			t.Errorf("agent environment variable %s holds the OpenStack password", name)
		case bytes.Contains(value, []byte(l.CloudsPath())), bytes.Contains(value, []byte("clouds.yaml")):
			t.Errorf("agent environment variable %s names a clouds.yaml", name)
		}
	}
	if !bytes.Contains(agentCfg, []byte("provider: nats")) || len(agentCfg) == 0 {
		t.Errorf("agent config without inventory.provider nats:\n%s", agentCfg)
	}
	keystone := strings.TrimPrefix(strings.TrimPrefix(env["OS_AUTH_URL"], "http://"), "https://")
	keystone, _, _ = strings.Cut(keystone, "/")
	if out, err := exec.Command("ip", "netns", "exec", l.Cloud.HVNS(), "bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(keystone, ":", "/", 1)).CombinedOutput(); err == nil {
		t.Errorf("Keystone %s is reachable from the agent's namespace (%s): the agent would not need to be credential-free", keystone, out)
	}

	// vm3 sends before its port exists; the port is created 6 s in.
	tr := lab.Transfer{From: "vm3", To: "vm1", Bytes: 4 << 20, Duration: units.Duration(20 * time.Second)}
	drive := make(chan error, 1)
	go func() { _, err := l.Drive(ctx, []lab.Transfer{tr}); drive <- err }()
	time.Sleep(6 * time.Second)
	t0 := time.Now()
	bound, err := l.RegisterPorts(ctx, "vm3")
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if len(bound) != 1 || bound[0].MAC != mac {
		t.Fatalf("RegisterPorts(vm3) = %+v, want one port with MAC %s", bound, mac)
	}
	portID := bound[0].ID
	if err := <-drive; err != nil {
		t.Fatal(err)
	}
	if err := pl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	lookups := scrape(t, "http://"+metrics+"/metrics", "tapflow_inventory_serve_lookups_total")
	svc.Process.Signal(syscall.SIGTERM)

	flows, err := lab.ReadFlows(pl.DataDir())
	if err != nil {
		t.Fatal(err)
	}
	// The times: port created -> the service added it -> the agent's
	// first snapshot holding it (its version attributed the records).
	added := firstLog(svcLog, "targeted lookup added ports", t0)
	swapped := firstLog(pl.LogPath(), "attribution snapshot swapped", t0)
	acme := vm3.Project.ID
	type key struct{ tenant, zone, dir string }
	table := map[key][2]int64{}
	var unknown, vm3Bytes, wrong, early int64
	minVer := int64(-1)
	for _, f := range flows {
		tn := f.TenantID
		if tn == acme {
			tn = "acme"
		}
		k := key{tn, f.Zone, f.Direction}
		v := table[k]
		table[k] = [2]int64{v[0] + 1, v[1] + f.Bytes}
		if f.TenantID == "unknown" || f.Zone == "miss" {
			unknown += f.Bytes
		}
		if f.VMMAC != mac {
			continue
		}
		vm3Bytes += f.Bytes
		if f.TimeStart < t0.UnixMicro() {
			early += f.Bytes // sent while Neutron had no port with this MAC
		}
		if f.TenantID != acme || f.ServerID != vm3.ID || f.PortID != portID || f.Zone != "same_tenant" || f.PeerTenantID != acme {
			wrong += f.Bytes
			if wrong == f.Bytes {
				t.Errorf("vm3 record %s→%s %s: tenant %s server %s port %s zone %s peer %s; want %s %s %s same_tenant %s",
					f.SrcIP, f.DstIP, f.Direction, f.TenantID, f.ServerID, f.PortID, f.Zone, f.PeerTenantID, acme, vm3.ID, portID, acme)
			}
		}
		if minVer < 0 || f.MetadataVersion < minVer {
			minVer = f.MetadataVersion
		}
	}
	var buf strings.Builder
	fmt.Fprintf(&buf, "\n== new VM: vm3 (%s) sends 4 MiB to vm1 over 20 s; its port %s created through Neutron 6 s in\n", mac, portID)
	fmt.Fprintf(&buf, "%-8s %-12s %-3s %8s %12s\n", "tenant", "zone", "dir", "records", "bytes")
	keys := make([]key, 0, len(table))
	for k := range table {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.tenant+a.zone+a.dir, b.tenant+b.zone+b.dir) })
	for _, k := range keys {
		fmt.Fprintf(&buf, "%-8s %-12s %-3s %8d %12d\n", k.tenant, k.zone, k.dir, table[k][0], table[k][1])
	}
	fmt.Fprintf(&buf, "vm3's records: %d B, %d B with a wrong tenant/server/port/zone; unknown/miss: %d B\n", vm3Bytes, wrong, unknown)
	fmt.Fprintf(&buf, "of them sent before the port create began: %d B (held by late binding, then attributed)\n", early)
	fmt.Fprintf(&buf, "port POST (Neutron on SQLite, with retries) took %s\n", created.Sub(t0).Round(time.Millisecond))
	since := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%s after the POST began, %s after it returned", at.Sub(t0).Round(time.Millisecond), at.Sub(created).Round(time.Millisecond))
	}
	fmt.Fprintf(&buf, "service's targeted lookup added the port: %s\n", since(added))
	fmt.Fprintf(&buf, "agent's attribution snapshot with it (held records released): %s\n", since(swapped))
	fmt.Fprintf(&buf, "vm3's records attributed with snapshot version ≥ %d; service lookups: %s\n", minVer, lookups)
	t.Log(buf.String())

	if vm3Bytes < 4<<20 {
		t.Errorf("vm3's records sum to %d B, want ≥ 4 MiB (the transfer)", vm3Bytes)
	}
	if wrong > 0 {
		t.Errorf("%d B of vm3's records misattributed", wrong)
	}
	if unknown > 0 {
		t.Errorf("%d B unknown/miss, want 0", unknown)
	}
	if early == 0 {
		t.Error("no vm3 record started before the port was created: the test did not exercise a VM sending before its port exists")
	}
	if swapped.IsZero() {
		t.Errorf("no attribution snapshot swapped on the agent after the port was created (log %s)", pl.LogPath())
	}
	if probs := pl.Problems(); len(probs) > 0 {
		t.Logf("agent log warnings: %v", probs)
	}
	// down deletes the port too.
	if err := l.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := getJSON(t, neutron+"/ports/"+portID, nil); code != 404 {
		t.Errorf("port %s after lab down: HTTP %d, want 404", portID, code)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startHelper runs the test binary as tapflow with args, its output in
// logPath, stopped (SIGTERM, then killed) at cleanup.
func startHelper(t *testing.T, c lab.Command, logPath string, args ...string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(c.Path, args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return cmd, done
}

// firstLog is when msg was first logged at or after since (zero: never).
func firstLog(path, msg string, since time.Time) time.Time {
	for _, e := range lab.ReadLog(path) {
		if e.Msg == msg && !e.Time.Before(since) {
			return e.Time
		}
	}
	return time.Time{}
}

func waitLog(t *testing.T, path string, exited <-chan struct{}, msg string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if !firstLog(path, msg, time.Time{}).IsZero() {
			return
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(path)
			t.Fatalf("exited before %q:\n%s", msg, b)
		case <-time.After(200 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("no %q in %s within %s:\n%s", msg, path, within, b)
}

// scrape returns the lines of one metric family.
func scrape(t *testing.T, url, family string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, family+"{") {
			out = append(out, strings.TrimPrefix(l, family))
		}
	}
	return strings.Join(out, " ")
}
