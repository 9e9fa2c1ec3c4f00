package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tapflow/tapflow/transport/roles"
)

// TestNATSConfig: the command prints the configuration docs/security.md
// shows for the doc's fleet, gives an ordered subscriber its slots and
// nothing of a custom collector durable, and refuses unusable names and
// consumer names two users would own.
func TestNATSConfig(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want []string // in stdout, or stderr when code != 0
	}{
		{"the doc's fleet", []string{"--agent", "cmp1", "--agent", "cmp2", "--subscriber", "analytics=analytics", "--ordered", "tap", "--ordered", "replay=2"}, exitOK,
			[]string{roles.Example().Render()}},
		{"custom collector durable", []string{"--agent", "cmp1", "--collector", "collector=billing", "--ordered", "tap=1"}, exitOK,
			[]string{`"$JS.API.CONSUMER.MSG.NEXT.TAPFLOW_FLOWS.billing"`, `"$JS.API.CONSUMER.CREATE.TAPFLOW_FLOWS.billing.>"`,
				"# subscriber: ordered consumers tap-0 (tapflow tap", `"$JS.API.CONSUMER.DELETE.TAPFLOW_METERS.tap-0"`}},
		{"ordered slots not a number", []string{"--agent", "a", "--ordered", "tap=0"}, exitUsage, []string{`--ordered tap=0: "0" is not a slot count`}},
		{"slot is another subscriber's durable", []string{"--agent", "a", "--subscriber", "an=tap-1", "--ordered", "tap"}, exitUsage,
			[]string{`user tap: "tap-1" is both subscriber an's durable and ordered subscriber tap's slot`}},
		{"slot is a collector's durable", []string{"--agent", "a", "--collector", "collector=tap-0", "--ordered", "tap"}, exitUsage,
			[]string{`"tap-0" is both collector collector's flows durable and ordered subscriber tap's slot`}},
		{"no agent", []string{"--ordered", "tap"}, exitUsage, []string{"no --agent"}},
		{"wildcard node", []string{"--agent", "cmp.>"}, exitUsage, []string{`"cmp.>" is not a usable NATS name`}},
		{"subscriber on the collector's durable", []string{"--agent", "a", "--collector", "collector=billing", "--subscriber", "an=billing-meters"}, exitUsage, []string{`"billing-meters" is both collector collector's meters durable and subscriber an's durable`}},
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
			// Consumer rights are by name: no wildcard over names, no deny
			// list. (Other subjects may have wildcards: the inventory
			// service publishes every node's overlay.)
			if c.code == exitOK {
				for _, line := range strings.Split(got, "\n") {
					if strings.Contains(line, "$JS.API.CONSUMER.") && strings.Contains(line, `.*`) || strings.Contains(line, "deny:") {
						t.Errorf("a consumer right by wildcard or a deny list: %s", strings.TrimSpace(line))
					}
				}
			}
		})
	}
}
