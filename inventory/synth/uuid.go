package synth

import (
	"crypto/sha1"
	"fmt"
	"reflect"
	"strings"

	"github.com/tapflow/tapflow/inventory"
)

// WithUUIDs replaces every id (each string field named ID or ending in
// ID, references included) by a UUID derived from it, consistently, in
// place, and returns inv. Real clouds' ids are random UUIDs, which
// compress far worse than the generator's short names: sizes on the wire
// are measured with them.
func WithUUIDs(inv *inventory.Inventory) *inventory.Inventory {
	m := map[string]string{}
	walkIDs(reflect.ValueOf(inv).Elem(), func(s string) string {
		if s == "" {
			return s
		}
		u, ok := m[s]
		if !ok {
			h := sha1.Sum([]byte(s))
			u = fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
			m[s] = u
		}
		return u
	})
	return inv
}

func walkIDs(v reflect.Value, f func(string) string) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			walkIDs(v.Elem(), f)
		}
	case reflect.Slice:
		for i := range v.Len() {
			walkIDs(v.Index(i), f)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range v.NumField() {
			fv := v.Field(i)
			if fv.Kind() == reflect.String && (t.Field(i).Name == "ID" || strings.HasSuffix(t.Field(i).Name, "ID")) {
				fv.SetString(f(fv.String()))
				continue
			}
			walkIDs(fv, f)
		}
	}
}
