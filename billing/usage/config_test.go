package usage_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/billing/usage"
	"github.com/tapflow/tapflow/internal/config"
)

// TestConfig: the billing section as `tapflow validate` and the commands
// read it: defaults derived from the rest of the file, and every bad key
// named with its path and fix.
func TestConfig(t *testing.T) {
	t.Setenv("TAPFLOW_PROMETHEUS_PASSWORD", "")
	tests := []struct {
		name, yaml string
		want       []string // substrings of the error; none: valid
	}{
		{name: "defaults", yaml: "data_dir: /srv/tf\n"},
		{name: "settle derived from the pipeline", yaml: "collector:\n  roll_age: 1m\ncapture:\n  active_timeout: 20s\n"},
		{name: "receiver", yaml: "billing:\n  prometheus:\n    url: https://prom.example.net/api/v1/write\n    timeout: 10s\n"},
		{name: "token file not a file", yaml: "billing:\n  prometheus:\n    url: http://127.0.0.1:9090/api/v1/write\n    bearer_token_file: /dev/null\n", want: []string{"billing.prometheus.bearer_token_file: /dev/null: not a regular file"}},
		{name: "negative settle", yaml: "billing:\n  settle: -1m\n  rated_after: -1h\n", want: []string{"billing.settle: -1m0s is negative", "billing.rated_after: -1h0m0s is negative"}},
		{name: "interval, lookback", yaml: "billing:\n  interval: 0s\n  lookback: 30m\n", want: []string{"billing.interval: 0s is below 1s", "billing.lookback: 30m0s is below 1h"}},
		{name: "not http", yaml: "billing:\n  prometheus:\n    url: ftp://x/api/v1/write\n", want: []string{"billing.prometheus.url: \"ftp://x/api/v1/write\" is not an http(s) URL"}},
		{name: "credentials in the URL", yaml: "billing:\n  prometheus:\n    url: http://u:secret@127.0.0.1:9090/api/v1/write\n", want: []string{"billing.prometheus.url: holds credentials; remove user:password@"}},
		{name: "user without password", yaml: "billing:\n  prometheus:\n    url: http://127.0.0.1:9090/api/v1/write\n    username: tapflow\n", want: []string{"billing.prometheus.password_file: empty, and TAPFLOW_PROMETHEUS_PASSWORD is not set"}},
		{name: "missing password file", yaml: "billing:\n  prometheus:\n    url: http://127.0.0.1:9090/api/v1/write\n    username: tapflow\n    password_file: /nonexistent/pw\n", want: []string{"billing.prometheus.password_file: stat /nonexistent/pw"}},
		{name: "unknown key", yaml: "billing:\n  setle: 5m\n", want: []string{"billing.setle"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(tc.yaml))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				u := c.Billing.Usage
				want := usage.DeriveSettle(c.Collector.Parquet.RollAge.D(), c.Capture.ActiveTimeout.D(), c.Attribution.LateBinding.Window.D())
				if u.Data != c.Collector.Parquet.Output || !strings.HasSuffix(u.StateDir, "/billing") || u.Settle.D() != want || u.Interval.D() != 5*time.Minute || u.Lookback.D() != 168*time.Hour || u.RatedAfter.D() != time.Hour {
					t.Fatalf("resolved: %+v (settle want %s)", u, want)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows the password:\n%v", err)
			}
		})
	}
}
