package promwrite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/billing/promwrite"
	"github.com/tapflow/tapflow/internal/testkit/promserver"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
)

// TestWriteToPrometheus writes to Debian's real Prometheus (2.42, remote
// write receiver, out-of-order window) samples inside an hour 3 h in the
// past, as billing/usage does, and reads them back with the query
// CloudKitty asks: sum_over_time(m[3600s]) at the hour's end holds every
// sample inside the hour, a sample at the hour's start of the next hour's
// range does not leak, identical samples sent again change nothing.
func TestWriteToPrometheus(t *testing.T) {
	prom := promserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := promwrite.New(promwrite.Config{URL: prom.WriteURL(), Timeout: units.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	end := h.Add(time.Hour).UnixMilli()
	// A live sample first, as a Prometheus scraping anything has: the
	// head's newest time is now, so the hour's samples (and the series
	// they create) are out of order, as in production.
	if err := c.Write(ctx, []promwrite.Series{promwrite.NewSeries("scraped_now", nil, promwrite.Sample{Value: 1, TimestampMs: time.Now().UnixMilli()})}); err != nil {
		t.Fatal(err)
	}
	lbl := func(p string) []promwrite.Label {
		return []promwrite.Label{{Name: "project_id", Value: p}, {Name: "zone", Value: "external"}}
	}
	const big = 1<<53 - 1 // the largest integer a float64 holds exactly
	steps := []struct {
		name   string
		series []promwrite.Series
		err    string             // the write's error, if refused
		want   map[string]float64 // project → sum_over_time at the hour's end
	}{
		{"revision 0", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 123456789, TimestampMs: end - 1}),
			promwrite.NewSeries("test_billed_bytes", lbl("b"), promwrite.Sample{Value: big - 5, TimestampMs: end - 1}),
			// the previous hour's sample, at its own end − 1 ms: outside
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 7, TimestampMs: h.UnixMilli() - 1}),
		}, "", map[string]float64{"a": 123456789, "b": big - 5}},
		{"correction", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: -1000, TimestampMs: end - 2}),
			promwrite.NewSeries("test_billed_bytes", lbl("b"), promwrite.Sample{Value: 5, TimestampMs: end - 2}),
		}, "", map[string]float64{"a": 123455789, "b": big}},
		{"both again", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 123456789, TimestampMs: end - 1}, promwrite.Sample{Value: -1000, TimestampMs: end - 2}),
		}, "", map[string]float64{"a": 123455789, "b": big}},
		// What docs/billing.md says of Prometheus 2.42, and why usage never
		// re-sends a revision with other values: samples older than the
		// head's newest (every billed sample, in a Prometheus that scrapes)
		// go to the out-of-order head, which silently drops another value
		// at a timestamp it holds, with no error.
		{"other values at timestamps it holds", []promwrite.Series{
			promwrite.NewSeries("test_billed_bytes", lbl("a"), promwrite.Sample{Value: 1, TimestampMs: end - 2}, promwrite.Sample{Value: 1, TimestampMs: end - 1}),
		}, "", map[string]float64{"a": 123455789}},
	}
	for _, st := range steps {
		err := c.Write(ctx, st.series)
		if (err == nil) != (st.err == "") || (err != nil && !strings.Contains(err.Error(), st.err)) {
			t.Fatalf("%s: %v, want error %q", st.name, err, st.err)
		}
		got, err := prom.Query(ctx, `sum(sum_over_time(test_billed_bytes[3600s])) by (project_id)`, h.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for _, s := range got {
			m[s.Metric["project_id"]] = s.Value
		}
		for p, w := range st.want {
			if m[p] != w {
				t.Errorf("%s: project %s: sum_over_time %.0f, want %.0f (all: %v)", st.name, p, m[p], w, m)
			}
		}
	}
}

// TestWriteErrors: a receiver that is not there is retryable; a refusal
// (no remote-write receiver: 404) is not, and says how to enable it.
func TestWriteErrors(t *testing.T) {
	prom := promserver.Start(t)
	ctx := context.Background()
	s := []promwrite.Series{promwrite.NewSeries("x", nil, promwrite.Sample{Value: 1, TimestampMs: time.Now().UnixMilli()})}
	for _, tc := range []struct {
		name, url string
		retry     bool
		want      string
	}{
		{"wrong path", prom.URL + "/api/v1/writ", false, "--web.enable-remote-write-receiver"},
		{"nobody listening", "http://127.0.0.1:1/api/v1/write", true, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := promwrite.New(promwrite.Config{URL: tc.url, Timeout: units.Duration(10 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Write(ctx, s)
			if err == nil || promwrite.IsRetryable(err) != tc.retry || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v (retryable %v), want one containing %q, retryable %v", err, promwrite.IsRetryable(err), tc.want, tc.retry)
			}
		})
	}
}

// Test credentials of the Prometheus started with basic auth; Hash is
// bcrypt(Password), cost 10, as Prometheus' web config stores it.
const (
	authUser     = "tapflow"
	authPassword = "tapflow-test-password"
	authHash     = "$2a$10$EkaSYtZOW6c0BGODLbtz0Od1bGEm9u7HzH3Pdlg77ICKH5hkpUl5K"
)

// TestWriteBasicAuthTLS: against a Prometheus requiring basic auth over
// TLS (--web.config.file), the password from password_file or
// TAPFLOW_PROMETHEUS_PASSWORD is accepted with the CA in ca_file; a wrong
// password is refused (401, not retryable, a hint) without the password in
// the error; a certificate of an unknown CA is refused; a password file
// other users can read, a ca_file without a certificate and credentials in
// the URL are refused by Validate, naming the fix.
func TestWriteBasicAuthTLS(t *testing.T) {
	dir := t.TempDir()
	pki := transporttest.NewPKI(t, dir)
	var opts promserver.Options
	opts.BasicAuth.User, opts.BasicAuth.Password, opts.BasicAuth.Hash = authUser, authPassword, authHash
	opts.TLS.Cert, opts.TLS.Key, opts.TLS.CA = pki.ServerCert, pki.ServerKey, pki.CA
	prom := promserver.StartWith(t, opts)
	if !strings.HasPrefix(prom.URL, "https://") {
		t.Fatalf("not TLS: %s", prom.URL)
	}
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", authPassword, 0o600)
	wrong := file("wrong", "not-the-password", 0o600)
	open := file("open", authPassword, 0o644)
	notPEM := file("not-pem", "hello", 0o644)
	s := []promwrite.Series{promwrite.NewSeries("auth_test", nil, promwrite.Sample{Value: 1, TimestampMs: time.Now().UnixMilli()})}
	tests := []struct {
		name    string
		cfg     promwrite.Config
		env     string
		ca      string // "": pki.CA; "-": none (the system trust store)
		invalid string // Validate's error
		refused string // Write's error
		retry   bool
	}{
		{name: "password_file", cfg: promwrite.Config{Username: authUser, PasswordFile: good}},
		{name: "environment", cfg: promwrite.Config{Username: authUser}, env: authPassword},
		{name: "wrong password", cfg: promwrite.Config{Username: authUser, PasswordFile: wrong}, refused: "HTTP 401: Unauthorized (check username/password_file"},
		{name: "no credentials", refused: "HTTP 401"},
		{name: "system trust store only", cfg: promwrite.Config{Username: authUser, PasswordFile: good}, ca: "-", refused: "certificate signed by unknown authority", retry: true},
		{name: "another CA", cfg: promwrite.Config{Username: authUser, PasswordFile: good}, ca: pki.OtherCA, refused: "certificate signed by unknown authority", retry: true},
		{name: "world-readable file", cfg: promwrite.Config{Username: authUser, PasswordFile: open}, invalid: "readable by every user"},
		{name: "user without password", cfg: promwrite.Config{Username: authUser}, invalid: promwrite.PasswordEnv},
		{name: "ca_file without a certificate", ca: notPEM, invalid: "ca_file: " + notPEM + ": no PEM certificate in it"},
		{name: "credentials in the URL", cfg: promwrite.Config{URL: strings.Replace(prom.WriteURL(), "https://", "https://"+authUser+":"+authPassword+"@", 1)}, invalid: "remove user:password@"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(promwrite.PasswordEnv, tc.env)
			cfg := tc.cfg
			if cfg.URL == "" {
				cfg.URL = prom.WriteURL()
			}
			switch tc.ca {
			case "":
				cfg.CAFile = pki.CA
			case "-":
			default:
				cfg.CAFile = tc.ca
			}
			cfg.Timeout = units.Duration(10 * time.Second)
			c, err := promwrite.New(cfg)
			if tc.invalid != "" {
				if err == nil || !strings.Contains(err.Error(), tc.invalid) || strings.Contains(err.Error(), authPassword) {
					t.Fatalf("New: %v; want an error naming %q, without the password", err, tc.invalid)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.Write(context.Background(), s)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("Write: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused) || promwrite.IsRetryable(err) != tc.retry ||
				strings.Contains(err.Error(), "not-the-password") || strings.Contains(err.Error(), authPassword)):
				t.Fatalf("Write: %v (retryable %v); want %q, retryable %v, without the password", err, promwrite.IsRetryable(err), tc.refused, tc.retry)
			}
		})
	}
}

// TestWriteManySeries: more series than one request carries go in several
// requests, every one arrives.
func TestWriteManySeries(t *testing.T) {
	prom := promserver.Start(t)
	ctx := context.Background()
	c, err := promwrite.New(promwrite.Config{URL: prom.WriteURL(), Timeout: units.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	n := 2*promwrite.MaxSeriesPerRequest + 1
	s := make([]promwrite.Series, n)
	for i := range s {
		s[i] = promwrite.NewSeries("many_test", []promwrite.Label{{Name: "project_id", Value: fmt.Sprintf("p%05d", i)}},
			promwrite.Sample{Value: float64(i), TimestampMs: h.Add(time.Hour).UnixMilli() - 1})
	}
	if err := c.Write(ctx, s); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]float64{
		`count(sum_over_time(many_test[3600s]))`: float64(n),
		`sum(sum_over_time(many_test[3600s]))`:   float64(n * (n - 1) / 2),
	} {
		res, err := prom.Query(ctx, q, h.Add(time.Hour))
		if err != nil || len(res) != 1 || res[0].Value != want {
			t.Errorf("%s = %v (%v), want %.0f", q, res, err, want)
		}
	}
}
