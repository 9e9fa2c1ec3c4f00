package lab_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	labfiles "github.com/tapflow/tapflow/deploy/lab"
	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/nslab"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/lab"
	"github.com/tapflow/tapflow/schemas"
)

// The acceptance suite runs every scenario of deploy/lab/scenarios on real
// namespaces, real HAProxy/keepalived/nftables and real traffic: packets
// on taps → eBPF → enrich → NATS → Parquet, then the expected table and
// byte-exact conservation are checked from the Parquet files.
//
// The test binary is its own helper: re-executed (inside namespaces) with
// helperEnv set, it is `tapflow lab serve|send`, or `tapflow run` (the
// same config.Load + app.RunAll as the CLI, race detector included), or
// `tapflow inventory serve` (app.RunInventoryServe).

const helperEnv = "TAPFLOW_LAB_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func helper(args []string) int {
	serve := len(args) > 1 && args[0] == "inventory" && args[1] == "serve"
	if serve {
		args = args[1:]
	} else if len(args) == 0 || args[0] != "run" {
		return lab.HelperMain(args, os.Stdout, os.Stderr)
	}
	fset := flag.NewFlagSet(args[0], flag.ContinueOnError)
	path := fset.String("config", "", "")
	detach := fset.Bool("detach", false, "as tapflow run --detach")
	if err := fset.Parse(args[1:]); err != nil {
		return 2
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.Capture.Detach = *detach
	log := obs.NewLogger(os.Stderr, cfg.Log.Format, cfg.Log.Level)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if serve { // `tapflow inventory serve` (TestRegisterNewVM)
		if err := app.RunInventoryServe(ctx, cfg, log); err != nil {
			log.Error("tapflow inventory serve failed", "err", err)
			return 1
		}
		return 0
	}
	if err := app.RunAll(ctx, cfg, log); err != nil {
		log.Error("tapflow run failed", "err", err)
		return 1
	}
	return 0
}

func self(t *testing.T) lab.Command {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return lab.Command{Path: exe, Env: []string{helperEnv + "=1"}}
}

// requireLab skips under -short; it needs root and the Debian packages
// (installed here when missing, idempotently), and fails without them as
// root or in CI (internal/testkit/prereq).
func requireLab(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the lab suite needs root, network namespaces and real traffic")
	}
	prereq.Root(t, "to create network namespaces and attach eBPF (make test-e2e)")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := lab.InstallPackages(ctx, &out); err != nil {
		prereq.Require(t, "the lab's Debian packages", err, "make deps (deploy/scripts/deps.sh) installs them; check apt-get update works")
	}
}

func prefix(t *testing.T) string {
	b := make([]byte, 3)
	rand.Read(b)
	p := "tfe" + hex.EncodeToString(b)
	t.Cleanup(func() {
		if _, err := lab.Teardown(context.Background(), p, "", slog.New(slog.DiscardHandler)); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return p
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

// TestScenarios is the acceptance suite: one subtest per scenario file.
// Run one with -run 'TestScenarios/octavia-lb-attribution'.
func TestScenarios(t *testing.T) {
	requireLab(t)
	names, err := lab.ListScenarios(labfiles.FS, "scenarios")
	if err != nil || len(names) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	start, ran := time.Now(), 0
	for _, n := range names {
		name := strings.TrimSuffix(filepath.Base(n), ".yaml")
		t.Run(name, func(t *testing.T) {
			ran++
			sc, err := lab.LoadScenario(labfiles.FS, n)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := self(t)
			out, err := lab.RunScenario(ctx, sc, lab.RunOptions{
				Prefix: prefix(t), StateDir: t.TempDir(), Helper: cmd, Tapflow: cmd, DataDir: t.TempDir(), Logger: testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			out.Print(&buf)
			t.Log(buf.String())
			if n := out.Failed(); n > 0 {
				t.Errorf("%d check(s) failed (see the table and checks above)", n)
			}
			if out.Conservation.Unattributed > 0 {
				t.Errorf("%d records carry metadata_version 0 (attributed before the inventory loaded)", out.Conservation.Unattributed)
			}
			if extra := extraChecks[name]; extra != nil {
				extra(t, out)
			}
			keepFailed(t, name, out.DataDir)
		})
	}
	t.Logf("suite: %d scenarios in %s", ran, time.Since(start).Round(time.Second))
}

// keepFailed copies a failed scenario's data directory (flows, meters,
// tapflow.log) to $TAPFLOW_LAB_KEEP/<scenario>-<time> when that is set:
// the test's own temporary directory is removed when it ends, and an
// intermittent failure is read from its files.
func keepFailed(t *testing.T, name, dir string) {
	keep := os.Getenv("TAPFLOW_LAB_KEEP")
	if keep == "" || !t.Failed() {
		return
	}
	dst := filepath.Join(keep, name+"-"+time.Now().UTC().Format("20060102T150405"))
	if err := os.CopyFS(dst, os.DirFS(dir)); err != nil {
		t.Logf("keep the failed scenario's data: %v", err)
		return
	}
	t.Logf("failed scenario's data kept in %s", dst)
}

// TestFailedUpLeavesNothing: a lab whose servers cannot start is removed
// entirely by Up itself.
func TestFailedUpLeavesNothing(t *testing.T) {
	requireLab(t)
	data, _ := fs.ReadFile(labfiles.FS, "basic.yaml")
	p := prefix(t)
	state := filepath.Join(t.TempDir(), "state")
	l, err := lab.New(data, "basic.yaml", lab.Options{Prefix: p, StateDir: state, Helper: lab.Command{Path: "/bin/false"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Up(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("Up = %v, want a server that exited", err)
	}
	if ns, _ := lab.ListNamespaces(p); len(ns) > 0 {
		t.Errorf("namespaces left behind: %v", ns)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state directory left behind: %v", err)
	}
}

// TestDownAfterCrash: with only the prefix (the state directory lost, the
// process that built the lab gone), down ends every process and removes
// every namespace; the host's own interfaces are untouched.
func TestDownAfterCrash(t *testing.T) {
	requireLab(t)
	before, _ := os.ReadDir("/sys/class/net")
	data, _ := fs.ReadFile(labfiles.FS, "demo.yaml")
	p := prefix(t)
	state := filepath.Join(t.TempDir(), "state")
	l, err := lab.New(data, "demo.yaml", lab.Options{Prefix: p, StateDir: state, Helper: self(t), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	var pids []int
	ready, _ := os.ReadDir(filepath.Join(state, "ready"))
	for _, e := range ready {
		b, _ := os.ReadFile(filepath.Join(state, "ready", e.Name()))
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid)
		}
	}
	if len(pids) < 5 {
		t.Fatalf("only %d servers ready", len(pids))
	}
	os.RemoveAll(state) // the crash lost the state
	names, err := lab.Teardown(context.Background(), p, "", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(l.Cloud.Namespaces()) {
		t.Errorf("removed %d namespaces, the lab had %d", len(names), len(l.Cloud.Namespaces()))
	}
	if ns, _ := lab.ListNamespaces(p); len(ns) > 0 {
		t.Errorf("namespaces left: %v", ns)
	}
	time.Sleep(100 * time.Millisecond)
	for _, pid := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z") {
			t.Errorf("server pid %d still runs", pid)
		}
	}
	// Nothing the lab made may be left in the host namespace. Compare names,
	// not counts: other test packages run in parallel and create and remove
	// their own devices (internal/testkit/nslab's bridges and taps).
	had := map[string]bool{}
	for _, e := range before {
		had[e.Name()] = true
	}
	after, _ := os.ReadDir("/sys/class/net")
	for _, e := range after {
		if !had[e.Name()] && !nslab.IsHostDevice(e.Name()) {
			t.Errorf("host interface %s appeared during the lab's life and is still there", e.Name())
		}
	}
}

// TestPreflightMissingPackages: without haproxy/keepalived on PATH, Up
// refuses with the install command (and creates nothing).
func TestPreflightMissingPackages(t *testing.T) {
	data, _ := fs.ReadFile(labfiles.FS, "demo.yaml")
	l, err := lab.New(data, "demo.yaml", lab.Options{Prefix: "tfpre", Helper: lab.Command{Path: "/bin/true"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	err = l.Preflight()
	want := "install the Debian packages: apt-get install -y iproute2 nftables haproxy keepalived"
	if os.Geteuid() != 0 {
		want = "needs root"
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Preflight = %v, want it to say %q", err, want)
	}
}

// extraChecks prove that a lifecycle scenario exercised what it names,
// beyond its table: records that left the kernel before the port was
// known (late binding) or after it was deleted (ghost window).
var extraChecks = map[string]func(t *testing.T, out *lab.Outcome){
	"agent-restart": func(t *testing.T, out *lab.Outcome) {
		// Three restarts (kill, term, the --detach run), each adopting
		// the pinned state of the one before.
		b, err := os.ReadFile(filepath.Join(out.DataDir, "tapflow.log"))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), `"msg":"adopted pinned capture state"`); n != 3 {
			t.Errorf("%d runs adopted the pinned capture state, want 3", n)
		}
		if !strings.Contains(string(b), `"msg":"pinned capture state removed"`) {
			t.Error("the --detach run did not remove the pinned state")
		}
	},
	"late-binding": func(t *testing.T, out *lab.Outcome) {
		added := out.StepTimes[2].UnixMicro() // steps: start, sleep, add, wait
		tap := out.Cloud.Server("vm3").Ports[0].HostDev
		acme := out.Cloud.Project("acme").ID
		var early, bound int64
		vm1 := out.Cloud.Server("vm1").Ports[0].V4().String()
		for _, f := range out.Flows {
			// the transfer's records (vm3's early multicast — ND, MLD — is
			// not held: multicast is classified before the VM MAC is looked up)
			if f.Ifname == tap && f.Direction == "tx" && f.DstIP == vm1 && f.TimeEnd < added {
				early += f.Bytes
				if f.TenantID == acme && f.Zone == "same_tenant" {
					bound += f.Bytes
				}
			}
		}
		if early < 512<<10 || bound != early {
			t.Errorf("vm3 sent %d bytes in records that ended before its port was added; %d of them late-bound to acme/same_tenant (want ≥ 512KiB, all)", early, bound)
		}
	},
	"ghost-window": func(t *testing.T, out *lab.Outcome) {
		removed := out.StepTimes[2].UnixMicro() // steps: start, sleep, remove, wait
		tap := out.Cloud.Server("vm2").Ports[0].HostDev
		acme := out.Cloud.Project("acme").ID
		var late, kept int64
		vm1 := out.Cloud.Server("vm1").Ports[0].V4().String()
		for _, f := range out.Flows {
			if f.Ifname == tap && f.Direction == "tx" && f.DstIP == vm1 && f.TimeStart > removed {
				late += f.Bytes
				if f.TenantID == acme && f.Zone == "same_tenant" {
					kept += f.Bytes
				}
			}
		}
		if late < 512<<10 || kept != late {
			t.Errorf("vm2 sent %d bytes in records that started after its port was removed; %d of them still attributed to acme/same_tenant (want ≥ 512KiB, all)", late, kept)
		}
	},
	"mac-reuse": func(t *testing.T, out *lab.Outcome) {
		// Every record of a tap belongs to the project of the port that
		// owned the MAC while the tap lived: a1's last records (leaving the
		// kernel as its tap went, with b1's port already created) are
		// acme's, b1's never acme's.
		owner := map[string]string{}
		for name, proj := range map[string]string{"a1": "acme", "a2": "acme", "b1": "globex", "b2": "globex"} {
			owner[out.Cloud.Server(name).Ports[0].HostDev] = out.Cloud.Project(proj).ID
		}
		for _, f := range out.Flows {
			// Unicast: b1's guest may send link-local multicast (MLD) in
			// the moment between lab up and its unplug, while a1 owns the
			// MAC (the lab's two taps with one MAC; in a cloud b1's tap
			// comes after its port).
			if want, ok := owner[f.Ifname]; ok && f.TenantID != want && f.Zone != "multicast" {
				t.Errorf("record on %s (%s %s → %s, %d bytes, vm_mac %s) is tenant %s zone %s, want %s", f.Ifname, f.Direction,
					f.SrcIP, f.DstIP, f.Bytes, f.VMMAC, f.TenantID, f.Zone, want)
			}
		}
	},
	"live-migration": func(t *testing.T, out *lab.Outcome) {
		// vm1's upload is in both agents' records: before the move on hv's,
		// after it on hv2's (and at least 512 KiB on each).
		tap := out.Cloud.Server("vm1").Ports[0].HostDev
		vm2 := out.Cloud.Server("vm2").Ports[0].V4().String()
		per := map[string]int64{}
		for _, f := range out.Flows {
			if f.Ifname == tap && f.Direction == "tx" && f.DstIP == vm2 {
				per[f.AgentID] += f.Bytes
			}
		}
		t.Logf("vm1's upload per agent: %v", per)
		if len(per) != 2 {
			t.Fatalf("vm1's upload is in the records of %d agents (%v), want 2", len(per), per)
		}
		for a, b := range per {
			if b < 512<<10 {
				t.Errorf("agent %s recorded %d bytes of vm1's upload, want ≥ 512KiB on each side of the move", a, b)
			}
		}
	},
	"live-migrate-round-trip": func(t *testing.T, out *lab.Outcome) {
		// hv's agent records vm1's upload before the trip and after its
		// return (≥ 256 KiB each side, with hv2's records between them);
		// hv2's agent ≥ 512 KiB of it.
		tap := out.Cloud.Server("vm1").Ports[0].HostDev
		vm2 := out.Cloud.Server("vm2").Ports[0].V4().String()
		var away []schemas.Flow
		var home []schemas.Flow
		for _, f := range out.Flows {
			if f.Ifname != tap || f.Direction != "tx" || f.DstIP != vm2 {
				continue
			}
			if strings.HasSuffix(f.AgentID, "-hv-hv2") {
				away = append(away, f)
			} else {
				home = append(home, f)
			}
		}
		if len(away) == 0 || len(home) == 0 {
			t.Fatalf("vm1's upload: %d records on hv2's agent, %d on hv's; want both", len(away), len(home))
		}
		first, last := away[0].TimeStart, away[0].TimeEnd
		var awayBytes int64
		for _, f := range away {
			first, last = min(first, f.TimeStart), max(last, f.TimeEnd)
			awayBytes += f.Bytes
		}
		const slack = 50_000 // µs: coarse kernel clock ticks
		var before, after, between int64
		for _, f := range home {
			switch {
			case f.TimeEnd <= first+slack:
				before += f.Bytes
			case f.TimeStart >= last-slack:
				after += f.Bytes
			default:
				between += f.Bytes
			}
		}
		t.Logf("vm1's upload: hv before %d B, hv2 %d B, hv after %d B, hv overlapping hv2's time %d B", before, awayBytes, after, between)
		if before < 256<<10 || after < 256<<10 || awayBytes < 512<<10 {
			t.Errorf("want ≥ 256 KiB on hv before and after the trip and ≥ 512 KiB on hv2")
		}
		if between != 0 {
			t.Errorf("%d B of hv's records overlap the time vm1 ran on hv2", between)
		}
	},
	"trunk": func(t *testing.T, out *lab.Outcome) {
		// The tag is on the record: VLAN 100 exactly on the subports'
		// records, 0 on the parents'; no duplicate_mac for the shared MAC.
		sub := map[string]bool{}
		for _, s := range []string{"vm1", "vm2"} {
			for _, sp := range out.Cloud.Server(s).Ports[0].Subports {
				sub[sp.Port.ID] = true
			}
		}
		var tagged int64
		for _, f := range out.Flows {
			if sub[f.PortID] != (f.VLANID == 100) && f.Bytes > 1024 {
				t.Errorf("record on %s port %s vlan %d (%s → %s, %d bytes): subport records carry VLAN 100, the parents' none", f.Ifname, f.PortID, f.VLANID, f.SrcIP, f.DstIP, f.Bytes)
			}
			if f.VLANID == 100 {
				tagged += f.Bytes
			}
		}
		if tagged < 4<<20 {
			t.Errorf("%d bytes in tagged records, want ≥ 4MiB (2 MiB at each tap)", tagged)
		}
		b, _ := os.ReadFile(filepath.Join(out.DataDir, "tapflow.log"))
		if strings.Contains(string(b), `"class":"duplicate_mac"`) || strings.Contains(string(b), `"class":"trunk_skipped"`) {
			t.Errorf("tapflow logged a duplicate_mac or trunk_skipped anomaly for the trunks")
		}
	},
	"extraroute-appliance": extrarouteAnomalies,
	"extraroute-dangling":  extrarouteAnomalies,
}

// extrarouteAnomalies: of extraroute.yaml's three routes the resolver
// flags exactly one, the dangling one (10.7.0.0/16: no port holds its
// next hop); the appliance routes resolve without an anomaly.
func extrarouteAnomalies(t *testing.T, out *lab.Outcome) {
	b, err := os.ReadFile(filepath.Join(out.DataDir, "tapflow.log"))
	if err != nil {
		t.Fatal(err)
	}
	var anomalies []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"inventory anomaly"`) {
			anomalies = append(anomalies, line)
		}
	}
	if len(anomalies) != 1 || !strings.Contains(anomalies[0], `"class":"dangling_route"`) || !strings.Contains(anomalies[0], "10.7.0.0/16") {
		t.Errorf("inventory anomalies in tapflow's log: want one dangling_route for 10.7.0.0/16, got %d:\n%s", len(anomalies), strings.Join(anomalies, "\n"))
	}
}
