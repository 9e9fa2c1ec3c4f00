//go:build linux

package bpf

import (
	"reflect"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestLayout checks that the Go mirrors agree byte for byte with the C
// structs compiled into the committed flow_bpfel.o: same size, same field
// order, same offsets and sizes.
func TestLayout(t *testing.T) {
	spec, err := loadFlow()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    string
		goT  reflect.Type
		size uintptr
	}{
		{"flow_key", reflect.TypeOf(FlowKey{}), 60},
		{"flow_key4", reflect.TypeOf(FlowKey4{}), 32},
		{"flow_key6", reflect.TypeOf(FlowKey6{}), 56},
		{"flow_val", reflect.TypeOf(FlowVal{}), 40},
		{"flow_ent", reflect.TypeOf(FlowEnt{}), 48},
		{"flow_record", reflect.TypeOf(FlowRecord{}), 104},
		{"meter", reflect.TypeOf(Meter{}), 64},
		{"sweep_args", reflect.TypeOf(SweepArgs{}), 40},
		{"flow_cent", reflect.TypeOf(FlowCent{}), 128},
		{"flush_args", reflect.TypeOf(FlushArgs{}), 24},
	} {
		t.Run(tc.c, func(t *testing.T) {
			var s *btf.Struct
			if err := spec.Types.TypeByName(tc.c, &s); err != nil {
				t.Fatalf("BTF struct %s: %v", tc.c, err)
			}
			if uintptr(s.Size) != tc.goT.Size() || tc.goT.Size() != tc.size {
				t.Fatalf("size: C %d, Go %d, contract %d", s.Size, tc.goT.Size(), tc.size)
			}
			var fields []reflect.StructField
			for i := 0; i < tc.goT.NumField(); i++ {
				if f := tc.goT.Field(i); f.Name != "_" {
					fields = append(fields, f)
				}
			}
			if len(fields) != len(s.Members) {
				t.Fatalf("C has %d members, Go %d fields", len(s.Members), len(fields))
			}
			for i, m := range s.Members {
				f := fields[i]
				sz, err := btf.Sizeof(m.Type)
				if err != nil {
					t.Fatal(err)
				}
				if uintptr(m.Offset.Bytes()) != f.Offset || uintptr(sz) != f.Type.Size() {
					t.Errorf("%s.%s: C offset %d size %d; Go %s offset %d size %d",
						tc.c, m.Name, m.Offset.Bytes(), sz, f.Name, f.Offset, f.Type.Size())
				}
			}
		})
	}
}
