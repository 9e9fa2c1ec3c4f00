//go:build linux

package bpf

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// captureCaps are the capabilities the capture needs, and why.
var captureCaps = []struct {
	bit      int
	name     string
	sysAdmin bool // CAP_SYS_ADMIN grants it too (the kernel's pre-5.8 rule)
}{
	{unix.CAP_BPF, "CAP_BPF", true},              // maps, programs, bpf(2)
	{unix.CAP_PERFMON, "CAP_PERFMON", true},      // the verifier's full checks
	{unix.CAP_NET_ADMIN, "CAP_NET_ADMIN", false}, // tc programs, tcx/tc attach
}

// MissingCaps names the capabilities of the capture this process lacks
// in its effective set; nil when it has them all or cannot tell.
func MissingCaps() []string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil
	}
	eff := uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	has := func(bit int) bool { return eff&(1<<bit) != 0 }
	var miss []string
	for _, c := range captureCaps {
		if !has(c.bit) && !(c.sysAdmin && has(unix.CAP_SYS_ADMIN)) {
			miss = append(miss, c.name)
		}
	}
	return miss
}

// permissionError explains a refusal by the kernel: which capability is
// missing and how to grant it, or, when none is, what else refuses.
func permissionError(err error) error {
	const need = "tapflow capture needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN: run it as root or grant them (the tapflow-agent systemd unit: AmbientCapabilities=CAP_BPF CAP_NET_ADMIN CAP_PERFMON)"
	if miss := MissingCaps(); len(miss) > 0 {
		return fmt.Errorf("permission denied: missing %s (uid %d); %s: %w", strings.Join(miss, ", "), os.Geteuid(), need, err)
	}
	return fmt.Errorf("permission denied although CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN are held (uid %d): a seccomp filter (systemd SystemCallFilter= must allow bpf), kernel lockdown or an LSM refuses eBPF: %w", os.Geteuid(), err)
}
