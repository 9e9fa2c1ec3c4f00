// Package dashboards holds tapflow's Grafana dashboards (*.json, import
// them or provision the folder). They are embedded so tests check their
// PromQL and every metric name against what the binary exposes.
package dashboards

import "embed"

// Files are the dashboard JSON files.
//
//go:embed *.json
var Files embed.FS
