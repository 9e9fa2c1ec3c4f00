package nslab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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

// TestLabSendsNothing: a lab's own devices send no packet while no test
// does (the conservation tests stop captures at moments of their choosing
// and count every packet): the bridge's counters and every tap's stay at
// 0 over the first seconds of a lab, when a snooping bridge floods its
// IGMP reports.
func TestLabSendsNothing(t *testing.T) {
	l := New(t)
	a, b := l.AddVM(1, true), l.AddVM(2, true)
	time.Sleep(3 * time.Second)
	for _, dev := range []string{l.Bridge, a.Tap, b.Tap} {
		for _, c := range []string{"tx_packets", "rx_packets"} {
			v, err := os.ReadFile(filepath.Join("/sys/class/net", dev, "statistics", c))
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.TrimSpace(string(v)); n != "0" {
				t.Errorf("%s %s = %s after 3 s with no traffic sent, want 0", dev, c, n)
			}
		}
	}
}
