package inventory

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// FuzzParse: the inventory file (inventory.provider: file, validate
// --inventory) as read from disk. No panic; an error names the file; a
// document read in pieces reads exactly as the whole-document reader
// reads it.
func FuzzParse(f *testing.F) {
	f.Add([]byte("{}"))
	f.Add([]byte(""))
	f.Add([]byte("ports:\n  - id: p1\n    mac_address: fa:16:3e:00:00:01\n    network_id: n1\n    fixed_ips: [{subnet_id: s1, ip_address: 10.0.0.5}]\nnetworks:\n  - id: n1\n"))
	f.Add([]byte("ports:\n  - id: p1\n  - id: p1\n"))                                           // duplicate
	f.Add([]byte("pools:\n  - id: pl\n    members: [{id: m}, {id: m}]\n"))                      // duplicate member
	f.Add([]byte("trunks:\n  - id: t\n    sub_ports: [{port_id: p, segmentation_id: 5000}]\n")) // bad VLAN
	f.Add([]byte("a: &a [*a, *a]\nports: *a\n"))                                                // alias loop
	f.Add([]byte(`{"ports": [{"id": "p", "fixed_ips": "x"}]}`))                                 // JSON, wrong type
	f.Add([]byte("x: &x [1,2]\ny: &y [*x,*x,*x,*x,*x,*x,*x,*x]\nz: &z [*y,*y,*y,*y,*y,*y,*y,*y]\nports: [*z,*z,*z,*z]\n"))
	f.Add([]byte("ports:\n- id: p1\n  network_id: &n n1\n- id: p2\n  network_id: *n\nnetworks:\n  - {id: n1}\n"))          // column 0, anchors
	f.Add([]byte("servers: [{id: a}]\nports:\n  - id: p\n    name: |\n      - x\n    fixed_ips:\n      - subnet_id: s\n")) // inline, block scalar
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := readStream(bytes.NewReader(data)); err == nil {
			w, werr := parseWhole(data, "fuzz.yaml")
			if werr != nil || !reflect.DeepEqual(s, w) {
				t.Fatalf("read in pieces: %+v\nwhole document: %+v (err %v)", s, w, werr)
			}
		}
		inv, err := Parse(data, "fuzz.yaml")
		if err != nil {
			if inv != nil {
				t.Fatal("an inventory with an error")
			}
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if inv == nil {
			t.Fatal("no inventory and no error")
		}
	})
}
