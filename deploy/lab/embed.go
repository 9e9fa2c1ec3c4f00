// Package labfiles embeds the lab's topologies (*.yaml) and acceptance
// scenarios (scenarios/*.yaml) into the tapflow binary, so `tapflow lab up
// demo` and `tapflow lab scenario NAME` work from any directory. The
// format of both is docs/lab.md.
package labfiles

import "embed"

// FS holds deploy/lab/*.yaml and deploy/lab/scenarios/*.yaml.
//
//go:embed *.yaml scenarios/*.yaml
var FS embed.FS
