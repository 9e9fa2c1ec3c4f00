package nslab

import "testing"

// TestIsHostDevice: a Lab's bridge and taps match; Nova's taps and the
// namespaces' names do not.
func TestIsHostDevice(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"brt3c1f9", true},
		{"tap3c1f91", true},
		{"tap3c1f9250", true},
		{"tap3c1f9", false},       // no VM number
		{"tap3c1f91234", false},   // four digits: not a VM number
		{"brt3c1f9x", false},      // more than the id
		{"brt3C1F9", false},       // upper case: hex.EncodeToString never makes it
		{"tapeeeeeeee-55", false}, // Nova's tap: tap + 11 characters of the port id
		{"tap0123456789a", false},
		{"nsl3c1f9-1", false},
		{"eth0", false},
		{"", false},
	} {
		if got := IsHostDevice(tc.name); got != tc.want {
			t.Errorf("IsHostDevice(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
