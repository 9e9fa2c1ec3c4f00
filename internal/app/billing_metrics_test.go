package app

import (
	"context"
	"testing"
	"time"

	"github.com/tapflow/tapflow/billing/cloudkitty"
	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/obs"
)

// billingProcess is `tapflow billing run` as the command builds it (the
// publisher's collectors in the process registry), with the series it
// writes by remote write (tapflow_billed_*) counted as exposed: docs and
// CloudKitty's metrics.yml name them.
func billingProcess(t *testing.T) process {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Billing.Usage.Prometheus.URL = "http://127.0.0.1:9/api/v1/write"
	cfg.Resolve()
	u := cfg.Billing.Usage
	out, err := dataset.Open(context.Background(), u.Data, dataset.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := promwrite.New(u.Prometheus)
	if err != nil {
		t.Fatal(err)
	}
	p, err := usage.New(usage.Options{Output: out, Writer: w, StateDir: u.StateDir, Settle: u.Settle.D(), Lookback: max(u.Lookback.D(), time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	reg := obs.NewRegistry()
	reg.MustRegister(p.Collectors()...)
	// billing.cloudkitty.enabled: the reprocess hook's metrics join the
	// process registry (the client connects at its first call, not here).
	ck := cloudkitty.DefaultConfig()
	ck.Enabled, ck.Endpoint = true, "http://127.0.0.1:9"
	c, err := cloudkitty.New(ck, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(c.Collectors()...)
	proc := gatheredProcess(t, "billing run", reg)
	proc.names = append(proc.names, usage.BytesMetric, usage.PacketsMetric)
	return proc
}
