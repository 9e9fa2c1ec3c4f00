//go:build linux

package install

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// captureCaps are the capabilities of the agent: load eBPF (CAP_BPF),
// the verifier's full checks for the tc programs (CAP_PERFMON), attach to
// the taps (CAP_NET_ADMIN). Nothing else.
var captureCaps = []string{"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"}

// units are the systemd units the package installs, what each runs and
// with which capabilities (none but the agent's).
var units = []struct {
	file, execStart string
	caps            []string
	families        []string
}{
	{"tapflow-agent.service", "/usr/bin/tapflow agent --config /etc/tapflow/tapflow.yaml", captureCaps, []string{"AF_INET", "AF_INET6", "AF_NETLINK"}},
	{"tapflow-collector.service", "/usr/bin/tapflow collector --config /etc/tapflow/tapflow.yaml", nil, []string{"AF_INET", "AF_INET6"}},
	{"tapflow.service", "/usr/bin/tapflow run --config /etc/tapflow/tapflow.yaml", nil, []string{"AF_INET", "AF_INET6"}},
	{"tapflow-inventory.service", "/usr/bin/tapflow inventory serve --config /etc/tapflow/tapflow.yaml", nil, []string{"AF_INET", "AF_INET6"}},
	{"tapflow-billing.service", "/usr/bin/tapflow billing run --config /etc/tapflow/tapflow.yaml --metrics-listen 127.0.0.1:9467", nil, []string{"AF_INET", "AF_INET6"}},
}

// hardening is what every unit sets, whatever it runs.
var hardening = map[string]string{
	"User":                    "tapflow",
	"Group":                   "tapflow",
	"NoNewPrivileges":         "yes",
	"ProtectSystem":           "strict",
	"ProtectHome":             "yes",
	"PrivateTmp":              "yes",
	"PrivateDevices":          "yes",
	"ProtectKernelTunables":   "yes",
	"ProtectKernelModules":    "yes",
	"ProtectKernelLogs":       "yes",
	"ProtectControlGroups":    "yes",
	"ProtectClock":            "yes",
	"ProtectHostname":         "yes",
	"RestrictNamespaces":      "yes",
	"RestrictRealtime":        "yes",
	"RestrictSUIDSGID":        "yes",
	"LockPersonality":         "yes",
	"MemoryDenyWriteExecute":  "yes",
	"SystemCallArchitectures": "native",
	"UMask":                   "0027",
}

// maxExposure bounds `systemd-analyze security` (0 = fully locked down,
// 10 = unprotected; "OK" is below 6.5). Measured with systemd 252: agent 1.8,
// the others 1.5.
const maxExposure = "2.0"

func unitsDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../../../deploy/systemd")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// readUnit returns the [Service] settings of a unit file; a key set more
// than once keeps every value (systemd appends most of them).
func readUnit(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		case section == "Service":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not key=value: %q", path, line)
			}
			kv[k] = append(kv[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return kv
}

func words(vs []string) []string {
	var w []string
	for _, v := range vs {
		w = append(w, strings.Fields(v)...)
	}
	slices.Sort(w)
	return w
}

// TestUnitsLeastPrivilege checks every unit of deploy/systemd for its
// command line, its user, its capabilities (the agent: exactly the three
// capture needs, the others none), its address families and the
// hardening every unit shares.
func TestUnitsLeastPrivilege(t *testing.T) {
	dir := unitsDir(t)
	files, _ := filepath.Glob(filepath.Join(dir, "*.service"))
	if len(files) != len(units) {
		t.Errorf("deploy/systemd has %d units, the test knows %d: add the new one to units", len(files), len(units))
	}
	for _, u := range units {
		t.Run(u.file, func(t *testing.T) {
			kv := readUnit(t, filepath.Join(dir, u.file))
			if got := kv["ExecStart"]; len(got) != 1 || got[0] != u.execStart {
				t.Errorf("ExecStart = %q, want %q", got, u.execStart)
			}
			for k, want := range hardening {
				if got := kv[k]; len(got) != 1 || got[0] != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			for _, k := range []string{"AmbientCapabilities", "CapabilityBoundingSet"} {
				if got := words(kv[k]); !slices.Equal(got, u.caps) {
					t.Errorf("%s = %q, want exactly %q", k, got, u.caps)
				}
			}
			if got := words(kv["RestrictAddressFamilies"]); !slices.Equal(got, u.families) {
				t.Errorf("RestrictAddressFamilies = %q, want %q", got, u.families)
			}
			if got := kv["StateDirectory"]; u.file != "tapflow-inventory.service" && !slices.Equal(got, []string{"tapflow"}) {
				t.Errorf("StateDirectory = %q, want tapflow (/var/lib/tapflow, data_dir of the example config)", got)
			}
			if u.caps == nil && len(kv["ExecStartPre"]) > 0 {
				t.Errorf("ExecStartPre = %q: only the agent prepares bpffs", kv["ExecStartPre"])
			}
		})
	}
	agent := readUnit(t, filepath.Join(dir, "tapflow-agent.service"))
	if got := agent["BindPaths"]; !slices.Equal(got, []string{"-/sys/fs/bpf/tapflow"}) {
		t.Errorf("agent BindPaths = %q, want the pin directory -/sys/fs/bpf/tapflow (capture.pin_dir)", got)
	}
}

// TestUnitsVerify runs `systemd-analyze verify` and an offline
// `systemd-analyze security` review on the units as they are in the
// repository. verify insists that ExecStart names an executable, so the
// copies checked here point at this test binary instead of
// /usr/bin/tapflow (TestPackageInstall verifies the installed units
// unchanged).
func TestUnitsVerify(t *testing.T) {
	needAnalyze(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	var paths []string
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(unitsDir(t), u.file))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(tmp, u.file)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/bin/tapflow", self)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	verifyUnits(t, paths)
}

func needAnalyze(t *testing.T) {
	t.Helper()
	prereq.Command(t, "systemd-analyze", "make deps (deploy/scripts/deps.sh) installs Debian's systemd package")
}

// verifyUnits: verify must print nothing and succeed; the security review
// must stay at or below maxExposure. Neither needs systemd as PID 1.
func verifyUnits(t *testing.T, paths []string) {
	t.Helper()
	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, p := range paths {
		out, err := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager",
			"--threshold="+strings.ReplaceAll(maxExposure, ".", ""), p).CombinedOutput()
		last := lastLine(string(out))
		if err != nil {
			t.Errorf("systemd-analyze security %s: %v (want exposure ≤ %s)\n%s", filepath.Base(p), err, maxExposure, out)
			continue
		}
		t.Log(last)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
