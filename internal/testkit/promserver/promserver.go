// Package promserver runs Debian's Prometheus (the prometheus package,
// 2.42 on Debian 12; make deps installs it) for tests: on a free loopback
// port, with its TSDB in a temp dir, the remote-write receiver on and an
// out-of-order window, as docs/billing.md tells operators to run it for
// CloudKitty. It also asks instant queries. No product code lives here.
package promserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// OutOfOrderWindow is storage.tsdb.out_of_order_time_window of the
// servers started here (docs/billing.md: ≥ billing.lookback).
const OutOfOrderWindow = "7d"

// Server is a running Prometheus.
type Server struct {
	// URL is its base, http://127.0.0.1:port.
	URL string
	// Log is its output file.
	Log string

	user, pass string       // basic auth of Query and the readiness probe
	hc         *http.Client // trusts the server's CA with TLS
}

// Options change what Start runs.
type Options struct {
	// BasicAuth requires HTTP basic auth on every endpoint (Prometheus'
	// --web.config.file basic_auth_users): user, password and the
	// password's bcrypt hash (Prometheus stores only the hash).
	BasicAuth struct{ User, Password, Hash string }
	// TLS serves https with this certificate and key (PEM files); CA is
	// what Query and the readiness probe trust.
	TLS struct{ Cert, Key, CA string }
}

// Start runs prometheus until the test ends.
func Start(t testing.TB) *Server { return StartWith(t, Options{}) }

// WriteURL is the remote-write endpoint.
func (s *Server) WriteURL() string { return s.URL + "/api/v1/write" }

// Config is the prometheus.yml the servers run with: no scrape jobs
// (nothing else writes), the out-of-order window.
const Config = `global:
  evaluation_interval: 1m
storage:
  tsdb:
    out_of_order_time_window: ` + OutOfOrderWindow + `
`

// StartWith runs prometheus with opts until the test ends.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := prereq.Command(t, "prometheus", "make deps (deploy/scripts/deps.sh) installs Debian's prometheus package")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(Config), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config.file=" + cfg, "--storage.tsdb.path=" + filepath.Join(dir, "data"), "--web.enable-remote-write-receiver", "--log.level=warn"}
	var web string
	if a := opts.BasicAuth; a.User != "" {
		web += "basic_auth_users:\n  " + a.User + ": " + a.Hash + "\n"
	}
	scheme, hc := "http", http.DefaultClient
	if tc := opts.TLS; tc.Cert != "" {
		web += "tls_server_config:\n  cert_file: " + tc.Cert + "\n  key_file: " + tc.Key + "\n"
		ca, err := os.ReadFile(tc.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		scheme, hc = "https", &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	if web != "" {
		p := filepath.Join(dir, "web.yml")
		if err := os.WriteFile(p, []byte(web), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--web.config.file="+p)
	}
	var lastErr error
	for range 3 { // a free port can be taken between the probe and the bind
		addr, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{URL: scheme + "://" + addr, Log: filepath.Join(dir, "prometheus.log"), user: opts.BasicAuth.User, pass: opts.BasicAuth.Password, hc: hc}
		logf, err := os.Create(s.Log)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, append(args, "--web.listen-address="+addr)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start prometheus: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if lastErr = s.waitReady(exited, 60*time.Second); lastErr == nil {
			t.Cleanup(func() {
				_ = cmd.Process.Signal(os.Interrupt)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
				_ = logf.Close()
			})
			return s
		}
		_ = cmd.Process.Kill()
		<-exited
		_ = logf.Close()
		out, _ := os.ReadFile(s.Log)
		t.Logf("prometheus on %s did not come up: %v\n%s", addr, lastErr, out)
	}
	t.Fatalf("prometheus did not start: %v", lastErr)
	return nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *Server) waitReady(exited chan error, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("exited: %v", err)
		default:
		}
		resp, err := s.get(context.Background(), s.URL+"/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready within %s", within)
}

// Sample is one element of an instant vector.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Query evaluates an instant query at t.
func (s *Server) Query(ctx context.Context, q string, at time.Time) ([]Sample, error) {
	u := s.URL + "/api/v1/query?" + url.Values{"query": {q}, "time": {strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)}}.Encode()
	resp, err := s.get(ctx, u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("query %s: HTTP %d: %s", q, resp.StatusCode, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %s, want vector", q, r.Data.ResultType)
	}
	out := make([]Sample, 0, len(r.Data.Result))
	for _, e := range r.Data.Result {
		str, _ := e.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %w", q, e.Value[1], err)
		}
		out = append(out, Sample{Metric: e.Metric, Value: v})
	}
	return out, nil
}

func (s *Server) get(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if s.user != "" {
		req.SetBasicAuth(s.user, s.pass)
	}
	return s.hc.Do(req)
}
