package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/schemas"
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
	noAgentCfg := filepath.Join(dir, "no-agent.yaml")
	if err := os.WriteFile(noAgentCfg, []byte("node: a\nmetrics:\n  listen: 127.0.0.1:1\ninventory:\n  file: "+inv+"\n"), 0o644); err != nil {
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
		{"run help", []string{"run", "--help"}, exitOK, []string{"--duration", "--nats-url", "drains the stream"}, nil},
		{"collector help", []string{"collector", "-h"}, exitOK, []string{"acked only after"}, nil},
		{"inventory dump needs config", []string{"inventory", "dump"}, exitUsage, nil, []string{"--config FILE"}},
		{"inventory dump of a file", []string{"inventory", "dump", "--config", invCfg}, exitOK, []string{"ports:"}, nil},
		{"inventory confirm needs config", []string{"inventory", "confirm"}, exitUsage, nil, []string{"--config FILE is required", "tapflow inventory confirm --help"}},
		{"inventory confirm without a running agent", []string{"inventory", "confirm", "--config", noAgentCfg}, exitRuntime, nil, []string{"is the agent running with metrics.listen 127.0.0.1:1"}},
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

// TestReportCLI runs tapflow report on a small data directory: flags,
// formats, the exact time range and every bad-input exit.
func TestReportCLI(t *testing.T) {
	dir := t.TempDir()
	h10 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	recs := parquettest.Flows(parquettest.Spec{Records: 3000, Tenants: 3, Start: h10, Span: 100 * time.Minute})
	byHour := map[int][]schemas.Flow{}
	for _, f := range recs {
		h := time.UnixMicro(f.TimeEnd).UTC().Hour()
		byHour[h] = append(byHour[h], f)
	}
	for h, rs := range byHour {
		p := filepath.Join(dir, "flows", "dt=2026-11-29", fmt.Sprintf("hour=%02d", h), "test-1-1.parquet")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		w := pq.NewGenericWriter[schemas.Flow](f, pq.KeyValueMetadata(schemas.MetadataKey, schemas.SchemaName))
		if _, err := w.Write(rs); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(keep func(*schemas.Flow) bool) (n, bytes int64) {
		for i := range recs {
			if keep(&recs[i]) {
				n++
				bytes += recs[i].Bytes
			}
		}
		return n, bytes
	}
	all := func(*schemas.Flow) bool { return true }
	from, to := h10.Add(20*time.Minute), h10.Add(70*time.Minute)
	inRange := func(f *schemas.Flow) bool { return f.TimeEnd >= from.UnixMicro() && f.TimeEnd < to.UnixMicro() }
	tenant := recs[0].TenantID
	ofTenantExt := func(f *schemas.Flow) bool { return inRange(f) && f.TenantID == tenant && f.Zone == "external" }
	jsonTotal := func(keep func(*schemas.Flow) bool) string {
		n, b := sum(keep)
		var p int64
		for i := range recs {
			if keep(&recs[i]) {
				p += recs[i].Packets
			}
		}
		return fmt.Sprintf(`"total":{"records":%d,"packets":%d,"bytes":%d}`, n, p, b)
	}
	n, b := sum(all)
	cases := []struct {
		name     string
		args     []string
		code     int
		out, err []string
	}{
		{"default table", []string{"--data", dir}, exitOK, []string{"tenant_id", "direction", "TOTAL", fmt.Sprint(n), fmt.Sprint(b), "files: 2"}, []string{"report took"}},
		{"demo grouping", []string{"--data", dir, "--by", "tenant,zone,direction,external_network"}, exitOK, []string{"external_network", "public"}, nil},
		{"json range tenant zone", []string{"--data", dir, "--from", "2026-11-29T10:20:00Z", "--to", "2026-11-29T11:10", "--tenant", tenant, "--zone", "external", "--by", "server", "--format", "json"},
			exitOK, []string{`"by":["server_id"]`, `"from":"2026-11-29T10:20:00Z"`, `"to":"2026-11-29T11:10:00Z"`, jsonTotal(ofTenantExt)}, nil},
		{"csv by lb", []string{"--data", dir, "--by", "lb,lb_segment", "--format", "csv"}, exitOK, []string{"lb_id,lb_segment,records,packets,bytes\n"}, nil},
		{"help", []string{"--help"}, exitOK, []string{"--from ≤ time_end < --to", "--by", "--format", "--names", "ifname"}, nil},
		{"unknown dimension", []string{"--data", dir, "--by", "tenant,colour"}, exitUsage, nil, []string{`unknown dimension "colour"`, "use a comma-separated list of tenant, zone"}},
		{"bad time", []string{"--data", dir, "--from", "yesterday"}, exitUsage, nil, []string{`--from "yesterday" is not a time`, "RFC 3339"}},
		{"from after to", []string{"--data", dir, "--from", "2026-11-29T11", "--to", "2026-11-29T10"}, exitUsage, nil, []string{"is not before --to", "[from, to)"}},
		{"from equals to", []string{"--data", dir, "--from", "2026-11-29", "--to", "2026-11-29T00:00:00Z"}, exitUsage, nil, []string{"is not before --to"}},
		{"unknown format", []string{"--data", dir, "--format", "xml"}, exitUsage, nil, []string{`--format "xml"`, "use table, csv or json"}},
		{"unknown zone", []string{"--data", dir, "--zone", "internet"}, exitUsage, nil, []string{`--zone "internet"`, "same_tenant"}},
		{"missing names file", []string{"--data", dir, "--names", filepath.Join(dir, "nope.yaml")}, exitUsage, nil, []string{"--names", "nope.yaml"}},
		{"stray argument", []string{"--data", dir, "tenant"}, exitUsage, nil, []string{`unexpected argument "tenant"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(append([]string{"report"}, tc.args...), &out, &errb); code != tc.code {
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
