package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCLI(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("node: a\nsource: tape\ncollector:\n  roll_size: 12x\nnats:\n  ulr: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inv := filepath.Join(dir, "inv.yaml")
	if err := os.WriteFile(inv, []byte("ports:\n  - id: p1\n    mac_address: fa:16:3e:00:00:01\n    project_id: t1\n    network_id: n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	invCfg := filepath.Join(dir, "inv-cfg.yaml")
	if err := os.WriteFile(invCfg, []byte("node: a\ninventory:\n  file: "+inv+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		args     []string
		code     int
		out, err []string // substrings expected on stdout / stderr
	}{
		{"no args", nil, exitUsage, nil, []string{"Commands:"}},
		{"help", []string{"help"}, exitOK, []string{"tapflow <command>"}, nil},
		{"unknown", []string{"frobnicate"}, exitUsage, nil, []string{`unknown command "frobnicate"`}},
		{"version", []string{"version"}, exitOK, []string{"tapflow "}, nil},
		{"validate example", []string{"validate", "../../deploy/examples/tapflow.yaml"}, exitOK, []string{"ok"}, nil},
		{"validate demo", []string{"validate", "../../deploy/examples/demo.yaml"}, exitOK, []string{"ok"}, nil},
		{"validate bad lists every error", []string{"validate", bad}, exitUsage, nil, []string{
			`collector.roll_size: "12x": not a size; use e.g. 128MiB`, "nats.ulr: unknown key",
		}},
		{"validate missing file", []string{"validate", filepath.Join(dir, "nope.yaml")}, exitUsage, nil, []string{"no such file"}},
		{"run with bad config exits 2", []string{"run", "--config", bad}, exitUsage, nil, []string{"invalid config", "collector.roll_size"}},
		{"run help", []string{"run", "--help"}, exitOK, nil, []string{"-duration", "-nats-url", "drains the stream"}},
		{"collector help", []string{"collector", "-h"}, exitOK, nil, []string{"acked only after"}},
		{"inventory dump needs config", []string{"inventory", "dump"}, exitUsage, nil, []string{"--config FILE"}},
		{"inventory dump of a file", []string{"inventory", "dump", "--config", invCfg}, exitOK, []string{"ports:"}, nil},
		{"report needs data", []string{"report"}, exitUsage, nil, []string{"--data is required"}},
		{"report on empty dir", []string{"report", "--data", dir}, exitRuntime, nil, []string{"flows"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out.String(), errb.String())
			}
			for _, s := range tc.out {
				if !strings.Contains(out.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, out.String())
				}
			}
			for _, s := range tc.err {
				if !strings.Contains(errb.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, errb.String())
				}
			}
		})
	}
}
