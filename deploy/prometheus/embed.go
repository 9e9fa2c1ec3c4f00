// Package promrules holds tapflow's Prometheus recording and alert rules
// (tapflow-rules.yml) and their promtool unit tests (tests/). The files
// are embedded so tests elsewhere check every metric name they use
// against what the binary exposes.
package promrules

import (
	_ "embed"
	"regexp"
	"sort"
)

// Rules is tapflow-rules.yml.
//
//go:embed tapflow-rules.yml
var Rules []byte

// Tests is tests/tapflow-rules.test.yml (its input series use real names
// too).
//
//go:embed tests/tapflow-rules.test.yml
var Tests []byte

// metricName matches a tapflow metric name (recording rules are named
// tapflow:…, with colons, and do not match).
var metricName = regexp.MustCompile(`\btapflow_[a-z0-9_]*[a-z0-9]`)

// MetricNames returns the tapflow_* names text mentions, sorted, once each.
func MetricNames(text []byte) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range metricName.FindAll(text, -1) {
		if s := string(m); !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
