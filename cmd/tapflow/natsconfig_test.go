package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/transport/roles"
)

// TestNATSConfig: the command prints the configuration docs/security.md
// shows for the doc's fleet, protects a custom collector durable from
// ordered subscribers, and refuses unusable names.
func TestNATSConfig(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want []string // in stdout, or stderr when code != 0
	}{
		{"the doc's fleet", []string{"--agent", "cmp1", "--agent", "cmp2", "--subscriber", "analytics=analytics", "--ordered", "tap"}, exitOK,
			[]string{roles.Example().Render()}},
		{"custom collector durable", []string{"--agent", "cmp1", "--collector", "collector=billing", "--ordered", "tap"}, exitOK,
			[]string{`"$JS.API.CONSUMER.MSG.NEXT.TAPFLOW_FLOWS.billing"`, `"$JS.API.CONSUMER.DELETE.TAPFLOW_METERS.billing-meters"`, `"$JS.API.CONSUMER.CREATE.TAPFLOW_FLOWS.billing.>"`}},
		{"no agent", []string{"--ordered", "tap"}, exitUsage, []string{"no --agent"}},
		{"wildcard node", []string{"--agent", "cmp.>"}, exitUsage, []string{`"cmp.>" is not a usable NATS name`}},
		{"subscriber on the collector's durable", []string{"--agent", "a", "--collector", "collector=billing", "--subscriber", "an=billing-meters"}, exitUsage, []string{`"billing-meters" is a collector's consumer`}},
		{"user twice", []string{"--agent", "a", "--ordered", "ops"}, exitUsage, []string{`user "ops" given twice`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(append([]string{"nats-config"}, c.args...), &out, &errb)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, c.code, errb.String())
			}
			got := out.String()
			if c.code != exitOK {
				got = errb.String()
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
