package promrules

import (
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// promtool finds promtool (Debian's prometheus package; make deps
// installs it as root).
func promtool(t *testing.T) string {
	t.Helper()
	return prereq.Command(t, "promtool", "make deps (deploy/scripts/deps.sh) installs Debian's prometheus package")
}

// TestPrometheusRules: promtool check rules (syntax, lint) and promtool
// test rules (tests/tapflow-rules.test.yml) pass.
func TestPrometheusRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "tapflow-rules.yml"},
		{"test", "rules", "tests/tapflow-rules.test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Errorf("promtool %s: %v", strings.Join(args, " "), err)
		}
	}
}

// TestEveryAlertIsTested: each alert of tapflow-rules.yml has a unit test
// with a time at which it must not fire and one at which it fires.
func TestEveryAlertIsTested(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(Rules, &rules); err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(Tests, &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] {
				t.Errorf("%s: no unit test in which it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no unit test in which it does not fire", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts in tapflow-rules.yml")
	}
	t.Logf("%d alerts, each tested firing and not firing", n)
}
