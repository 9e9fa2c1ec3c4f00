package dashboards

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

type dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func load(t *testing.T) map[string]dashboard {
	t.Helper()
	out := map[string]dashboard{}
	names, err := fs.Glob(Files, "*.json")
	if err != nil || len(names) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	for _, n := range names {
		b, err := Files.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		out[n] = d
	}
	return out
}

// TestDashboardsWellFormed: every dashboard has a uid and title, unique
// panel ids, panels inside the 24-column grid, and a query per graph.
func TestDashboardsWellFormed(t *testing.T) {
	for name, d := range load(t) {
		if d.UID == "" || d.Title == "" {
			t.Errorf("%s: uid %q title %q", name, d.UID, d.Title)
		}
		ids := map[int]bool{}
		for _, p := range d.Panels {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d twice", name, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
				t.Errorf("%s: panel %q outside the grid: %+v", name, p.Title, p.GridPos)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", name, p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q has an empty query", name, p.Title)
				}
			}
		}
	}
}

// TestDashboardQueriesParse: every panel query is valid PromQL, checked
// by promtool (each becomes a recording rule, with Grafana's variables
// replaced by values).
func TestDashboardQueriesParse(t *testing.T) {
	bin := prereq.Command(t, "promtool", "make deps (deploy/scripts/deps.sh) installs Debian's prometheus package")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboards\n    rules:\n")
	n := 0
	r := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")
	for name, d := range load(t) {
		for _, p := range d.Panels {
			for i, tg := range p.Targets {
				n++
				q, _ := json.Marshal(r.Replace(tg.Expr)) // a JSON string is a YAML string
				fmt.Fprintf(&b, "      # %s: %s [%d]\n      - record: dashboard:q%d\n        expr: %s\n", name, p.Title, i, n, q)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "dashboards.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "rules", "--lint=none", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard queries: %v\n%s\n%s", err, out, b.String())
	}
	t.Logf("%d dashboard queries parse", n)
}
