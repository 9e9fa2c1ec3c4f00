package obs

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// serve starts Listen on loopback and returns its base URL.
func serve(t *testing.T, reg *Registry, opts ServerOptions) string {
	t.Helper()
	srv, err := Listen("127.0.0.1:0", reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + srv.Addr()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestReadyz: /readyz is 503 with every failing reason until each check
// passes, 200 then, and 503 again when a check fails (e.g. shutdown);
// /healthz stays 200 throughout (liveness). Notes never change the
// status; those with something to say follow, ready or not.
func TestReadyz(t *testing.T) {
	ready := NewReadiness()
	base := serve(t, NewRegistry(), ServerOptions{Ready: ready})
	var nats, stopping atomic.Bool
	steps := []struct {
		name   string
		before func()
		code   int
		body   []string
		not    []string
	}{
		{"no checks yet", func() {}, http.StatusServiceUnavailable, []string{"starting"}, nil},
		{"nats down", func() {
			ready.Add("nats", func() error {
				if !nats.Load() {
					return errors.New("not connected")
				}
				return nil
			})
			ready.Add("process", func() error {
				if stopping.Load() {
					return errors.New("shutting down")
				}
				return nil
			})
		}, http.StatusServiceUnavailable, []string{"nats: not connected"}, nil},
		{"all pass", func() { nats.Store(true) }, http.StatusOK, []string{"ready"}, []string{"note:"}},
		{"notes", func() {
			ready.Note("capture", func() string { return "pin goes with the agent" })
			ready.Note("quiet", func() string { return "" })
		}, http.StatusOK, []string{"ready\nnote: capture: pin goes with the agent\n"}, []string{"quiet"}},
		{"shutdown", func() { stopping.Store(true) }, http.StatusServiceUnavailable, []string{"process: shutting down", "note: capture: pin goes"}, nil},
		{"two reasons", func() { nats.Store(false) }, http.StatusServiceUnavailable, []string{"nats: not connected", "process: shutting down"}, nil},
	}
	for _, s := range steps {
		s.before()
		code, body := get(t, base+"/readyz")
		if code != s.code {
			t.Errorf("%s: /readyz = %d %q, want %d", s.name, code, body, s.code)
		}
		for _, w := range s.body {
			if !strings.Contains(body, w) {
				t.Errorf("%s: /readyz body %q lacks %q", s.name, body, w)
			}
		}
		for _, w := range s.not {
			if strings.Contains(body, w) {
				t.Errorf("%s: /readyz body %q has %q", s.name, body, w)
			}
		}
		if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
			t.Errorf("%s: /healthz = %d, want 200 (liveness)", s.name, code)
		}
	}
}

// TestPprofOnlyWhenEnabled: /debug/pprof/ is 404 unless metrics.pprof.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	for _, tc := range []struct {
		pprof bool
		want  int
	}{{false, http.StatusNotFound}, {true, http.StatusOK}} {
		base := serve(t, NewRegistry(), ServerOptions{Pprof: tc.pprof})
		for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
			if code, _ := get(t, base+p); code != tc.want {
				t.Errorf("pprof %v: GET %s = %d, want %d", tc.pprof, p, code, tc.want)
			}
		}
	}
}

// TestBuildInfo: tapflow_build_info is 1 with version, revision and Go
// version labels, and Names lists every registered metric (also a vector
// without children, which Gather does not show).
func TestBuildInfo(t *testing.T) {
	reg := NewRegistry()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "tapflow_build_info" {
			continue
		}
		found = true
		m := mf.GetMetric()[0]
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("tapflow_build_info = %v, want 1", m.GetGauge().GetValue())
		}
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for _, k := range []string{"version", "revision", "goversion"} {
			if labels[k] == "" {
				t.Errorf("tapflow_build_info has no %s label: %v", k, labels)
			}
		}
		if !strings.HasPrefix(labels["goversion"], "go") {
			t.Errorf("goversion = %q", labels["goversion"])
		}
	}
	if !found {
		t.Fatal("tapflow_build_info not registered")
	}
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tapflow_test_lost_total", Help: "x"}, []string{"reason"})
	reg.MustRegister(v)
	if n, _ := testutil.GatherAndCount(reg, "tapflow_test_lost_total"); n != 0 {
		t.Fatalf("a childless vector gathered %d series", n)
	}
	names := strings.Join(reg.Names(), " ")
	for _, w := range []string{"tapflow_build_info", "tapflow_test_lost_total", "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(names, w) {
			t.Errorf("Names() lacks %s: %s", w, names)
		}
	}
}
