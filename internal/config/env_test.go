package config

import (
	"strings"
	"testing"
)

func TestExpandEnv(t *testing.T) {
	env := map[string]string{"HOST": "nats1", "EMPTY": "", "PORT": "4222", "ML": "a\nb"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		name, in, out string
		errs          []string // each in the error; none: no error
	}{
		{"none", "node: a\n", "node: a\n", nil},
		{"set", "nats:\n  url: nats://${HOST}:${PORT}\n", "nats:\n  url: nats://nats1:4222\n", nil},
		{"default when unset", "node: ${NODE:-cmp1}\n", "node: cmp1\n", nil},
		{"default when empty", "node: ${EMPTY:-cmp1}\n", "node: cmp1\n", nil},
		{"empty without default", "node: x${EMPTY}\n", "node: x\n", nil},
		{"set wins over default", "node: ${HOST:-cmp1}\n", "node: nats1\n", nil},
		{"literal", "node: $${HOST}\n", "node: ${HOST}\n", nil},
		{"comment left alone", "# url: ${UNSET}\nnode: a # ${UNSET}\n", "# url: ${UNSET}\nnode: a # ${UNSET}\n", nil},
		{"hash inside quotes is not a comment", "node: \"a #${HOST}\"\n", "node: \"a #nats1\"\n", nil},
		{"unset names variable, path and line", "node: a\nnats:\n  url: ${NATS_URL}\n", "",
			[]string{"nats.url: ${NATS_URL} is not set (line 3); export NATS_URL, or give a default: ${NATS_URL:-value}"}},
		{"every unset one", "node: ${A1}\ndata_dir: ${A2}\n", "", []string{"node: ${A1} is not set (line 1)", "data_dir: ${A2} is not set (line 2)"}},
		{"line break refused", "node: ${ML}\n", "", []string{"node: ${ML} holds a line break (line 1)"}},
		{"bad name", "node: ${1X}\n", "", []string{"${1X}: not a variable name"}},
		{"unterminated", "node: ${HOST\n", "", []string{"unterminated ${ (line 1)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp, err := expandEnv([]byte(tc.in), lookup)
			if len(tc.errs) == 0 {
				if err != nil || string(exp.data) != tc.out {
					t.Fatalf("got %q, %v; want %q", exp.data, err, tc.out)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted: %q", exp.data)
			}
			for _, w := range tc.errs {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestEveryProblemListed: an unset variable, an unknown key and two type
// errors do not hide the invalid values elsewhere, and a field with a
// type error is not also reported for the default it kept.
func TestEveryProblemListed(t *testing.T) {
	_, err := Parse([]byte("node: a\nsource: tape\ncollector:\n  roll_size: 12x\nagent:\n  edge_capacity: lots\nnats:\n  ulr: x\n  codec: gzip\n  url: ${TAPFLOW_TEST_UNSET_URL}\nlog:\n  level: loud\n"))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{
		`source: "tape": unknown source`,
		`collector.roll_size: "12x": not a size`,
		"agent.edge_capacity: cannot unmarshal !!str `lots` into int",
		"nats.ulr: unknown key",
		`nats.codec: "gzip"`,
		"nats.url: ${TAPFLOW_TEST_UNSET_URL} is not set (line 10)",
		`log.level: "loud"`,
		"inventory.file: empty", // no valid source, so no synthetic inventory
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 8 {
		t.Errorf("%d problems, want 8:\n%v", n, err)
	}
}

// TestEnvValuesNeverShown: a value from the environment is replaced by its
// ${NAME} in every problem, whether validation or the YAML decoder quotes it.
func TestEnvValuesNeverShown(t *testing.T) {
	const secret = "hunter2.s3cr3t"
	t.Setenv("TAPFLOW_TEST_SECRET", secret)
	t.Setenv("TAPFLOW_TEST_NODE", "cmp1")
	for _, doc := range []string{
		"node: ${TAPFLOW_TEST_SECRET}\n",
		"node: a\nagent:\n  edge_capacity: ${TAPFLOW_TEST_SECRET}\n",
		"node: a\ncollector:\n  roll_age: x${TAPFLOW_TEST_SECRET}\n",
		"node: a\nnats:\n  url: nats://u:${TAPFLOW_TEST_SECRET}@:99999\n",
		"node: a\ncollector:\n  output: s3://b/p\n  s3:\n    endpoint: ${TAPFLOW_TEST_SECRET}\n",
		"node: a\nnats:\n  url: [${TAPFLOW_TEST_SECRET}\n", // not YAML
	} {
		t.Run(doc, func(t *testing.T) {
			_, err := Parse([]byte(doc))
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("secret shown:\n%v", err)
			}
		})
	}
	c, err := Parse([]byte("node: ${TAPFLOW_TEST_NODE}\ndata_dir: ${TAPFLOW_TEST_DIR:-/srv/tf}\n"))
	if err != nil || c.Node != "cmp1" || c.DataDir != "/srv/tf" {
		t.Fatalf("node %q data_dir %q: %v", c.Node, c.DataDir, err)
	}
}

// TestDuplicateKeysHideNothing: yaml.v3 skips a mapping that repeats a
// key; the rest of it is still checked.
func TestDuplicateKeysHideNothing(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"top level", "node: a\nsource: tape\nnode: b\nlog:\n  level: loud\n", []string{
			`node: mapping key "node" already defined at line 1; keep one of them`, `source: "tape": unknown source`, `log.level: "loud"`}},
		{"repeated section", "node: a\nnats:\n  codec: gzip\ncollector:\n  roll_size: 12x\nnats:\n  codec: none\n  ulr: x\n", []string{
			`nats: mapping key "nats" already defined at line 2`, `nats.codec: "gzip"`, `collector.roll_size: "12x"`}},
		{"nested", "node: a\nagent:\n  edge_capacity: 0\n  edge_capacity: 5\n  shutdown_timeout: 1ms\n", []string{
			`agent.edge_capacity: mapping key "edge_capacity" already defined at line 3`, "agent.shutdown_timeout: 1ms: too short"}},
		{"flow sequence names the key", "node: a\ncollector: [1]\nnats:\n  url: [x, y]\n", []string{"collector: cannot unmarshal !!seq", "nats.url: cannot unmarshal !!seq"}},
		{"flow mapping", "node: a\nlog: {level: info, level: debug}\n", []string{`mapping key "level" already defined`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}
