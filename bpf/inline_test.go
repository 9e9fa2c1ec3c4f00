//go:build linux

package bpf

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

// kallsyms returns the addresses of the named kernel symbols ("" for
// symbols not found or hidden by kptr_restrict).
func kallsyms(t *testing.T, names ...string) map[string]uint64 {
	t.Helper()
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		prereq.Require(t, "/proc/kallsyms", err, "mount procfs")
	}
	defer f.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 || !want[fs[2]] {
			continue
		}
		if a, err := strconv.ParseUint(fs[0], 16, 64); err == nil && a != 0 {
			out[fs[2]] = a
		}
	}
	return out
}

// TestPacketPathInlinesArrayLookups checks the program the kernel runs
// (xlated, after the verifier's rewrites): on the packet path no map
// lookup may go through the generic bpf_map_lookup_elem helper. It does
// when clang merges two lookups of different maps into one call (the
// verifier then cannot inline the array lookups): +20 ns per packet.
func TestPacketPathInlinesArrayLookups(t *testing.T) {
	o := loadForTest(t, Spec{})
	defer o.Close()
	syms := kallsyms(t, "__bpf_call_base", "bpf_map_lookup_elem")
	base, generic := syms["__bpf_call_base"], syms["bpf_map_lookup_elem"]
	if base == 0 || generic == 0 {
		prereq.Missing(t, "kernel symbol addresses in /proc/kallsyms (hidden by kptr_restrict)", "sysctl kernel.kptr_restrict=1 and run as root")
	}
	imm := int64(int32(generic - base))
	for name, p := range map[string]*ebpf.Program{"tc_ingress": o.Ingress(), "tc_egress": o.Egress()} {
		t.Run(name, func(t *testing.T) {
			info, err := p.Info()
			if err != nil {
				t.Fatal(err)
			}
			insns, err := info.Instructions()
			if err != nil {
				prereq.Require(t, "the kernel's xlated instructions", err, "run as root (CAP_SYS_ADMIN) with kernel.bpf_stats/bpf_jit settings that expose them")
			}
			calls := 0
			for i, ins := range insns {
				if ins.OpCode.JumpOp() != asm.Call || ins.Src != asm.R0 {
					continue
				}
				calls++
				if ins.Constant == imm {
					t.Errorf("insn %d: call to the generic bpf_map_lookup_elem helper (a map lookup the verifier could not inline)", i)
				}
			}
			if calls == 0 {
				t.Fatal("no helper calls found: cannot tell calls apart on this kernel")
			}
		})
	}
}
