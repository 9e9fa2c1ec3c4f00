//go:build linux

package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// probeFeatures checks the program, map and helper types the capture uses.
func probeFeatures() error {
	checks := []struct {
		what string
		err  func() error
	}{
		{"BPF_PROG_TYPE_SCHED_CLS (tc programs)", func() error { return features.HaveProgramType(ebpf.SchedCLS) }},
		{"BPF_PROG_TYPE_SYSCALL (flow sweep, kernel ≥ 5.14)", func() error { return features.HaveProgramType(ebpf.Syscall) }},
		{"BPF_MAP_TYPE_RINGBUF (kernel ≥ 5.8)", func() error { return features.HaveMapType(ebpf.RingBuf) }},
		{"bpf_ktime_get_coarse_ns (kernel ≥ 5.11)", func() error { return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnKtimeGetCoarseNs) }},
		{"bpf_for_each_map_elem (kernel ≥ 5.13)", func() error { return features.HaveProgramHelper(ebpf.Syscall, asm.FnForEachMapElem) }},
	}
	for _, c := range checks {
		if err := c.err(); err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) {
				return fmt.Errorf("kernel %s lacks %s: %w", kernelRelease(), c.what, err)
			}
			return fmt.Errorf("probe %s: %w", c.what, explain(err))
		}
	}
	return nil
}
