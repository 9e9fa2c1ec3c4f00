// Package promwrite is a Prometheus remote-write (protocol 1.0) client:
// it encodes a WriteRequest by hand (protobuf through protowire, block
// snappy), POSTs it to a receiver (Prometheus with
// --web.enable-remote-write-receiver, or anything speaking the protocol)
// and classifies the answer. It exists so tapflow can put samples with
// explicit timestamps inside a closed hour (billing/usage) without
// depending on prometheus/prometheus.
//
// Credentials (basic auth or a bearer token) come from files or the
// environment, never from the command line or the URL, and never appear in
// an error.
package promwrite

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/snappy"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tapflow/tapflow/internal/units"
)

// Environment variables holding the secrets when the *_file keys are empty:
// a service's environment, never a flag (flags show in ps).
const (
	PasswordEnv = "TAPFLOW_PROMETHEUS_PASSWORD"
	TokenEnv    = "TAPFLOW_PROMETHEUS_BEARER_TOKEN"
)

// Config is where and how to write.
type Config struct {
	// URL is the receiver's remote-write endpoint, e.g.
	// http://127.0.0.1:9090/api/v1/write.
	URL string `yaml:"url"`
	// Username with PasswordFile (or PasswordEnv): HTTP basic auth.
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
	// BearerTokenFile (or TokenEnv): Authorization: Bearer.
	BearerTokenFile string `yaml:"bearer_token_file"`
	// CAFile is a PEM bundle an https receiver's certificate must chain
	// to (default: the system trust store).
	CAFile string `yaml:"ca_file"`
	// Timeout bounds one request (default 30s).
	Timeout units.Duration `yaml:"timeout"`
}

// DefaultConfig returns the defaults; URL must still be set.
func DefaultConfig() Config { return Config{Timeout: units.Duration(30 * time.Second)} }

// Validate reports every invalid field as a *units.FieldError.
func (c Config) Validate() error {
	var e units.Errors
	if c.URL == "" {
		e.Add("url", "empty", "set the remote-write endpoint, e.g. http://127.0.0.1:9090/api/v1/write (Prometheus started with --web.enable-remote-write-receiver)")
	} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		e.Add("url", fmt.Sprintf("%q is not an http(s) URL", redact(c.URL)), "use e.g. http://127.0.0.1:9090/api/v1/write")
	} else if u.User != nil {
		e.Add("url", "holds credentials", "remove user:password@ from the URL: put the user in username and the password in password_file (or "+PasswordEnv+")")
	}
	if c.Username != "" && c.PasswordFile == "" && os.Getenv(PasswordEnv) == "" {
		e.Add("password_file", "empty, and "+PasswordEnv+" is not set, with username "+c.Username, "point password_file at a file holding the password (chmod 600), or export "+PasswordEnv)
	}
	if c.Username == "" && c.PasswordFile != "" {
		e.Add("password_file", "set without username", "set username to the user the password belongs to")
	}
	if c.Username != "" && (c.BearerTokenFile != "" || os.Getenv(TokenEnv) != "") {
		e.Add("bearer_token_file", "set together with username", "use basic auth (username, password_file) or a bearer token, not both")
	}
	for _, f := range []struct{ key, path string }{{"password_file", c.PasswordFile}, {"bearer_token_file", c.BearerTokenFile}} {
		if f.path == "" {
			continue
		}
		if err := checkSecretFile(f.path); err != nil {
			e.Add(f.key, err.Error(), "make it a regular file readable by tapflow only (chmod 600)")
		}
	}
	if c.CAFile != "" {
		if b, err := os.ReadFile(c.CAFile); err != nil {
			e.Add("ca_file", err.Error(), "point it at the PEM bundle of the CA that signed the receiver's certificate")
		} else if !x509.NewCertPool().AppendCertsFromPEM(b) {
			e.Add("ca_file", c.CAFile+": no PEM certificate in it", "point it at the PEM bundle of the CA that signed the receiver's certificate")
		}
	}
	if c.Timeout.D() < time.Second {
		e.Add("timeout", fmt.Sprintf("%s is below 1s", c.Timeout), "use e.g. 30s")
	}
	return e.Err()
}

// checkSecretFile refuses a missing, non-regular or world-accessible file.
func checkSecretFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", path)
	}
	if st.Mode().Perm()&0o007 != 0 {
		return fmt.Errorf("%s: mode %04o, readable by every user on the host", path, st.Mode().Perm())
	}
	return nil
}

func readSecret(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", key, path)
	}
	return s, nil
}

// redact drops userinfo from a URL for messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	u.User = url.User("xxx")
	return u.String()
}

// Label is one label; Series need them sorted by name, __name__ included.
type Label struct{ Name, Value string }

// Sample is one value at a time in milliseconds since the epoch.
type Sample struct {
	Value       float64
	TimestampMs int64
}

// Series is one time series and its samples, oldest first.
type Series struct {
	Labels  []Label
	Samples []Sample
}

// NewSeries returns a series named name with labels (name, value pairs)
// sorted as the protocol wants.
func NewSeries(name string, labels []Label, samples ...Sample) Series {
	ls := append([]Label{{"__name__", name}}, labels...)
	slices.SortFunc(ls, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
	return Series{Labels: ls, Samples: samples}
}

// Client writes to one receiver. It is safe for concurrent use.
type Client struct {
	url        string
	hc         *http.Client
	user, pass string
	token      string
}

// New validates cfg and reads its secrets; it sends nothing.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("promwrite: %w", err)
	}
	c := &Client{url: cfg.URL, hc: &http.Client{Timeout: cfg.Timeout.D()}, user: cfg.Username}
	var err error
	if cfg.CAFile != "" {
		b, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("promwrite: ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		c.hc.Transport = tr
	}
	if cfg.Username != "" {
		c.pass = os.Getenv(PasswordEnv)
		if cfg.PasswordFile != "" {
			if c.pass, err = readSecret("password_file", cfg.PasswordFile); err != nil {
				return nil, fmt.Errorf("promwrite: %w", err)
			}
		}
	}
	if cfg.BearerTokenFile != "" {
		if c.token, err = readSecret("bearer_token_file", cfg.BearerTokenFile); err != nil {
			return nil, fmt.Errorf("promwrite: %w", err)
		}
	} else if cfg.Username == "" {
		c.token = os.Getenv(TokenEnv)
	}
	return c, nil
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// Error is a write the receiver refused or that did not reach it.
type Error struct {
	// Status is the HTTP status, 0 when there was no answer.
	Status int
	// Retryable: a network error, 429 or 5xx (the protocol's rule); a 4xx
	// is a refusal that repeating the same request cannot change.
	Retryable bool
	Msg       string
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return "remote write: " + e.Msg
	}
	return fmt.Sprintf("remote write: HTTP %d: %s", e.Status, e.Msg)
}

// IsRetryable reports whether err is an *Error worth repeating.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// MaxSeriesPerRequest bounds one request (about 1 MB of protobuf with
// billing's labels): receivers bound what they decode.
const MaxSeriesPerRequest = 5000

// Write sends series, in requests of at most MaxSeriesPerRequest. When
// one fails, the requests before it were written: send the same series
// again. Samples the receiver already holds with the same timestamp and
// value are no-ops, which is what makes re-sending safe; another value at
// a timestamp it holds is refused (HTTP 400) or, out of order, silently
// dropped (Prometheus 2.42): never send one.
func (c *Client) Write(ctx context.Context, series []Series) error {
	for len(series) > 0 {
		n := min(len(series), MaxSeriesPerRequest)
		if err := c.write(ctx, series[:n]); err != nil {
			return err
		}
		series = series[n:]
	}
	return nil
}

func (c *Client) write(ctx context.Context, series []Series) error {
	body := snappy.Encode(nil, Encode(series))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return &Error{Msg: err.Error()}
	}
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("User-Agent", "tapflow-billing")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	switch {
	case c.user != "":
		req.SetBasicAuth(c.user, c.pass)
	case c.token != "":
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// url.Error names the URL, which holds no credentials (Validate).
		return &Error{Retryable: true, Msg: err.Error()}
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return &Error{
		Status:    resp.StatusCode,
		Retryable: resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500,
		Msg:       strings.TrimSpace(string(msg)) + hint(resp.StatusCode),
	}
}

func hint(status int) string {
	switch status {
	case http.StatusNotFound:
		return " (is the receiver enabled? Prometheus needs --web.enable-remote-write-receiver; the path is /api/v1/write)"
	case http.StatusUnauthorized, http.StatusForbidden:
		return " (check username/password_file or bearer_token_file)"
	}
	return ""
}

// Encode returns the protobuf WriteRequest (prometheus/prompb) of series,
// uncompressed:
//
//	WriteRequest { repeated TimeSeries timeseries = 1; }
//	TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
//	Label        { string name = 1; string value = 2; }
//	Sample       { double value = 1; int64 timestamp = 2; }
func Encode(series []Series) []byte {
	var out, ts, sub []byte
	for _, s := range series {
		ts = ts[:0]
		for _, l := range s.Labels {
			sub = sub[:0]
			sub = protowire.AppendTag(sub, 1, protowire.BytesType)
			sub = protowire.AppendString(sub, l.Name)
			sub = protowire.AppendTag(sub, 2, protowire.BytesType)
			sub = protowire.AppendString(sub, l.Value)
			ts = protowire.AppendTag(ts, 1, protowire.BytesType)
			ts = protowire.AppendBytes(ts, sub)
		}
		for _, p := range s.Samples {
			sub = sub[:0]
			sub = protowire.AppendTag(sub, 1, protowire.Fixed64Type)
			sub = protowire.AppendFixed64(sub, math.Float64bits(p.Value))
			sub = protowire.AppendTag(sub, 2, protowire.VarintType)
			sub = protowire.AppendVarint(sub, uint64(p.TimestampMs))
			ts = protowire.AppendTag(ts, 2, protowire.BytesType)
			ts = protowire.AppendBytes(ts, sub)
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, ts)
	}
	return out
}
