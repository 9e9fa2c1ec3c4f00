package inventory_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tapflow/tapflow/inventory"
	"github.com/tapflow/tapflow/inventory/synth"
)

// dumpYAML writes inv as inventory dump does (openstack.WriteInventory).
func dumpYAML(t testing.TB, inv *inventory.Inventory) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(inv); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestStreamMatchesWhole: a file in the dump layout is read in pieces
// (inventory.Streamed says so) and gives exactly what the whole-document
// reader gives; layouts the pieces cannot be cut from fall back to it.
func TestStreamMatchesWhole(t *testing.T) {
	o := synth.Realistic
	o.Tenants, o.LoadBalancers, o.WithIPv6 = 40, 5, true
	gen := synth.WithUUIDs(synth.Generate(o))
	gen.Trunks = []inventory.Trunk{{ID: "t1", PortID: gen.Ports[0].ID, SubPorts: []inventory.SubPort{{SegmentationType: "vlan", SegmentationID: 7, PortID: gen.Ports[1].ID}}}}
	dump := dumpYAML(t, gen)
	cases := []struct {
		name     string
		in       string
		streamed bool
	}{
		{"dump layout", string(dump), true},
		{"dump layout with a header comment", "# tapflow inventory dump: x\n# fetched now\n" + string(dump), true},
		{"items at column 0, comments and blank lines inside", "ports:\n- id: p1\n  # a comment\n\n  mac_address: fa:16:3e:00:00:01\n  fixed_ips:\n  - {subnet_id: s1, ip_address: 10.0.0.5}\n- id: p2\nnetworks:\n- id: n1\n  name: |\n    a block\n    - scalar\n", true},
		{"anchor inside one object", "ports:\n  - id: p1\n    network_id: &n n1\n    project_id: *n\n", true},
		{"flow collections on the key line", "projects: [{id: a}, {id: b}]\nservers: []\nports:\n  - id: p\n", true},
		{"empty collection", "ports:\nnetworks:\n  - id: n\n", true},
		{"anchor used by a later object of the same batch", "ports:\n  - id: p1\n    network_id: &n n1\n  - id: p2\n    network_id: *n\n", true},
		{"anchor used in the next batch", "ports:\n  - id: p0\n    network_id: &n n1\n" + manyPorts(300) + "  - id: last\n    network_id: *n\n", false},
		{"JSON", `{"ports": [{"id": "p1", "fixed_ips": [{"subnet_id": "s", "ip_address": "10.0.0.1"}]}]}`, false},
		{"document marker", "---\nports:\n  - id: p\n", false},
		{"same collection twice", "ports:\n  - id: a\nports:\n  - id: b\n", false},
		{"wrong type", "ports:\n  - id: p1\n  - id: p2\n    fixed_ips: 7\n", false},
		{"duplicate id", "servers:\n  - {id: s}\n  - {id: s}\n", false},
		{"null object", "servers:\n  - {id: s}\n  -\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			streamed, serr := inventory.Streamed([]byte(c.in))
			if (serr == nil) != c.streamed {
				t.Fatalf("read in pieces: %v, want %v (err %v)", serr == nil, c.streamed, serr)
			}
			whole, werr := inventory.ParseWhole([]byte(c.in), "t")
			got, err := inventory.Parse([]byte(c.in), "t")
			if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
				t.Fatalf("Parse error %v, whole-document error %v", err, werr)
			}
			if serr == nil && !reflect.DeepEqual(streamed, whole) {
				t.Fatalf("pieces and whole document differ:\n%+v\n%+v", streamed, whole)
			}
			if err == nil && !reflect.DeepEqual(got, whole) {
				t.Fatal("Parse differs from the whole-document reader")
			}
		})
	}
	whole, err := inventory.ParseWhole(dump, "t")
	if err != nil || len(whole.Ports) != len(gen.Ports) || len(whole.Ports) < 500 {
		t.Fatalf("the dump does not read back: %v", err)
	}
	if !strings.Contains(string(dump), "\n  - ") {
		t.Fatal("dump layout changed: objects are not indented by two")
	}
}

func manyPorts(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - id: p%d\n    mac_address: fa:16:3e:00:%02x:%02x\n", i+1, i>>8, i&0xff)
	}
	return b.String()
}
