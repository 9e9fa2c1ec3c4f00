package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	c.Node = "cmp1"
	c.Resolve()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid:\n%v", err)
	}
}

func TestExampleConfigValidates(t *testing.T) {
	if _, err := Load("../../deploy/examples/tapflow.yaml"); err != nil {
		t.Fatalf("deploy/examples/tapflow.yaml:\n%v", err)
	}
}

func TestErrorsNameFieldAndFix(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string // each must appear in the error text
	}{
		{"bad size", "node: a\ncollector:\n  roll_size: 12x\n", []string{`collector.roll_size: "12x": not a size; use e.g. 128MiB`}},
		{"bad duration", "node: a\ncollector:\n  roll_age: soon\n", []string{`collector.roll_age: "soon": not a duration`}},
		{"unknown key", "node: a\nnats:\n  ulr: x\n", []string{"nats.ulr: unknown key ulr"}},
		{"several at once", "node: a\nsource: tape\nnats:\n  codec: gzip\nlog:\n  level: loud\n", []string{
			`source: "tape": unknown source; use synthetic or ebpf`, `nats.codec: "gzip"`, `log.level: "loud"`,
		}},
		{"bad node", "node: a.b\n", []string{`node: "a.b": not usable in a NATS subject`}},
		{"agent id not the node", "node: a\nagent:\n  id: b\n", []string{`agent.id: "b" is not the node "a"`, "collector.agent_id_is_node: false"}},
		{"ack wait too short", "node: a\ncollector:\n  roll_age: 5m\n  ack_wait: 1m\n", []string{"collector.ack_wait:"}},
		{"ebpf needs inventory", "node: a\nsource: ebpf\n", []string{"inventory.file: empty with source: ebpf"}},
		{"missing inventory file", "node: a\ninventory:\n  file: /nonexistent/inv.yaml\n", []string{"inventory.file:"}},
		{"poll interval zero with synthetic", "node: a\ninventory:\n  poll_interval: 0s\n", []string{"inventory.poll_interval"}},
		{"not yaml", "node: [\n", []string{"not valid YAML"}},
		{"nats url scheme", "node: a\nnats:\n  url: http://nats1:4222\n", []string{`nats.url: "http://nats1:4222": scheme "http", want nats, tls, ws or wss`}},
		{"nats url port", "node: a\nnats:\n  url: nats://nats1:99999\n", []string{"nats.url:", "99999"}},
		{"s3 endpoint scheme", "node: a\ncollector:\n  output: s3://b/p\n  s3:\n    endpoint: s3.example.net\n", []string{`collector.s3.endpoint: "s3.example.net" is not an http(s) URL`}},
		{"s3 endpoint port", "node: a\ncollector:\n  output: s3://b/p\n  s3:\n    endpoint: http://127.0.0.1:0\n", []string{"collector.s3.endpoint: port 0 is not 1..65535"}},
		{"noauth url", "node: a\ninventory:\n  provider: openstack\n  openstack:\n    noauth:\n      neutron: neutron:9696\n      nova: http://:8774\n", []string{
			"inventory.openstack.noauth.neutron:", `inventory.openstack.noauth.nova: "http://:8774": no host`}},
		{"inventory guard and serve keys", "node: a\ninventory:\n  provider: nats\n  max_drop_fraction: 2\n  drop_confirm_reads: 0\n  drop_min_ports: -1\n  serve:\n    lease: 10ms\n", []string{
			"inventory.max_drop_fraction: 2 is not a fraction", "inventory.drop_confirm_reads", "inventory.drop_min_ports", "inventory.serve.lease: 10ms is too short"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
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

// TestAgentIDOtherThanNode: an agent.id of its own is accepted only with
// collector.agent_id_is_node off; left unset it is the node.
func TestAgentIDOtherThanNode(t *testing.T) {
	for _, y := range []string{"node: a\n", "node: a\nagent:\n  id: a\n", "node: a\nagent:\n  id: b\ncollector:\n  agent_id_is_node: false\n"} {
		if _, err := Parse([]byte(y)); err != nil {
			t.Errorf("%q: %v", y, err)
		}
	}
}

func TestResolveDerivesDefaults(t *testing.T) {
	c, err := Parse([]byte("node: cmp7\ndata_dir: /srv/tf\ncollector:\n  roll_age: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.ID != "cmp7" || c.Collector.Parquet.Output != "/srv/tf" || c.Collector.Consumer.AckWait.D().Minutes() != 3 {
		t.Fatalf("derived: agent.id=%q output=%q ack_wait=%s", c.Agent.ID, c.Collector.Parquet.Output, c.Collector.Consumer.AckWait)
	}
}

// TestDocsListEveryKey keeps docs/config.md in step with the structs.
func TestDocsListEveryKey(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range yamlKeys(reflect.TypeFor[Config](), "") {
		if !strings.Contains(string(doc), "`"+key+"`") {
			t.Errorf("docs/config.md does not document `%s`", key)
		}
	}
}

func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || tag[0] == "-" {
			continue
		}
		name := prefix
		if tag[0] != "" {
			name = strings.TrimPrefix(prefix+"."+tag[0], ".")
		}
		ft := f.Type
		if ft.Kind() == reflect.Struct && !strings.HasPrefix(ft.PkgPath(), "time") {
			if tag[0] != "" {
				keys = append(keys, name)
			}
			keys = append(keys, yamlKeys(ft, name)...)
			continue
		}
		keys = append(keys, name)
	}
	return keys
}
