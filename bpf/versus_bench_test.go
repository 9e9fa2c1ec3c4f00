//go:build linux && versus

package bpf

// The same-run comparison behind issue 16's kernel figures: the ingress
// program against another build of it (e.g. before a change) and against
// NetObserv's tc program, on the same frame, interleaved. Objects come from
// outside (not committed):
//
//	git show <commit>:bpf/flow_bpfel.o > /tmp/before.o
//	git -C netobserv-ebpf-agent show 56a7d35f:pkg/ebpf/bpf_x86_bpfel.o > /tmp/netobserv.o
//	VS_BEFORE=/tmp/before.o VS_NETOBSERV=/tmp/netobserv.o \
//	  go test -tags versus -run '^$' -bench Versus -benchtime 1x -count 3 ./bpf/
//
// VS_OBJS adds more tapflow objects (space-separated paths, named by file).

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// loadOther loads one tc program of an object file with every hash map
// sized to entries, a tapflow object's flow cache sized as shipped, and
// pinning removed.
func loadOther(b *testing.B, path, prog string, entries uint32, vars map[string]any) *ebpf.Program {
	b.Helper()
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		b.Fatal(err)
	}
	for n := range spec.Programs {
		if n != prog {
			delete(spec.Programs, n)
		}
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
		switch m.Type {
		case ebpf.Hash, ebpf.PerCPUHash, ebpf.LRUHash, ebpf.LRUCPUHash:
			m.MaxEntries = entries
		}
	}
	if _, ok := spec.Variables["cache_mask"]; ok {
		// A tapflow object: its flow cache at the shipped size, as Load
		// sizes it (the object's placeholders are 1024 slots).
		vars = maps.Clone(vars)
		if vars == nil {
			vars = map[string]any{}
		}
		vars["cache_mask"] = uint32(DefaultCacheSlots - 1)
		spec.Maps["cache0"].MaxEntries = DefaultCacheSlots
		spec.Maps["cache1"].MaxEntries = DefaultCacheSlots
		spec.Maps["caches"].InnerMap.MaxEntries = DefaultCacheSlots
	}
	for k, v := range vars {
		if err := spec.Variables[k].Set(v); err != nil {
			b.Fatalf("%s: set %s: %v", path, k, err)
		}
	}
	c, err := ebpf.NewCollection(spec)
	if err != nil {
		b.Fatalf("%s: %+v", path, err)
	}
	b.Cleanup(func() { c.Close() })
	return c.Programs[prog]
}

func mustEnv(b *testing.B, name, what string) string {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		b.Fatalf("set %s to %s (see the file comment)", name, what)
	}
	return v
}

// BenchmarkPerPacketVersus: hit (the flow exists), medians of 31
// interleaved rounds of 200,000 runs; ns, ns over empty and × empty.
func BenchmarkPerPacketVersus(b *testing.B) {
	o := loadForTest(b, Spec{FlowEntries: 1 << 10})
	f := benchFrame(0)
	progs := []*ebpf.Program{o.Empty(), o.Ingress(),
		loadOther(b, mustEnv(b, "VS_BEFORE", "a tapflow flow_bpfel.o to compare with"), "tc_ingress", 1<<10, nil),
		loadOther(b, mustEnv(b, "VS_NETOBSERV", "NetObserv's pkg/ebpf/bpf_x86_bpfel.o"), "tc_ingress_flow_parse", 1<<10, map[string]any{"sampling": uint32(1)})}
	names := []string{"empty", "this", "before", "netobserv"}
	for _, p := range strings.Fields(os.Getenv("VS_OBJS")) {
		progs = append(progs, loadOther(b, p, "tc_ingress", 1<<10, nil))
		names = append(names, strings.TrimSuffix(filepath.Base(p), ".o"))
	}
	for _, p := range progs[1:] {
		if _, err := p.Run(&ebpf.RunOptions{Data: f}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	m := interleavedNs(b, f, 200000, progs...)
	for i := range m {
		b.ReportMetric(m[i], names[i]+"_ns")
		if i > 0 {
			b.ReportMetric(m[i]-m[0], names[i]+"_+ns")
			b.ReportMetric(m[i]/m[0], names[i]+"_x")
		}
	}
	b.ReportMetric((m[3]-m[0])/(m[1]-m[0]), "netobserv_net_over_this")
}

// BenchmarkPerPacketVersusCycle: VS_FLOWS (default 20,000) flows visited
// round-robin, one run per packet, 5 rounds of fresh maps, medians: insert
// (new flows) and, primed, hits with every packet a cache miss. "table"
// is this object with the flow cache off.
//
// Its sweep cases flows=N/burst=B run the flow-count sweep of
// BenchmarkPerPacket with NetObserv's program (VS_NETOBSERV) beside the
// table and the empty program, and VS_BEFORE's when it is set.
func BenchmarkPerPacketVersusCycle(b *testing.B) {
	sweep(b, func(b *testing.B, entries uint32) ([]string, []*ebpf.Program) {
		names := []string{"netobserv"}
		progs := []*ebpf.Program{loadOther(b, mustEnv(b, "VS_NETOBSERV", "NetObserv's pkg/ebpf/bpf_x86_bpfel.o"), "tc_ingress_flow_parse", entries, map[string]any{"sampling": uint32(1)})}
		if p := os.Getenv("VS_BEFORE"); p != "" {
			names = append(names, "before")
			progs = append(progs, loadOther(b, p, "tc_ingress", entries, nil))
		}
		return names, progs
	})
	for _, primed := range []bool{false, true} {
		b.Run(map[bool]string{false: "insert", true: "cycle"}[primed], func(b *testing.B) {
			const flows = 20000
			frames := make([][]byte, flows)
			for i := range frames {
				frames[i] = benchFrame(i)
			}
			var e, n, nc, be []float64
			for r := 0; r < 5; r++ {
				o := loadForTest(b, Spec{FlowEntries: flows * 2, RingBytes: 1 << 22})
				onc := loadForTest(b, Spec{FlowEntries: flows * 2, RingBytes: 1 << 22, NoCache: true})
				before := loadOther(b, mustEnv(b, "VS_BEFORE", "a tapflow flow_bpfel.o to compare with"), "tc_ingress", flows*2, nil)
				if primed {
					for _, p := range []*ebpf.Program{o.Ingress(), onc.Ingress(), before} {
						cycleNs(b, p, frames)
					}
				}
				e = append(e, cycleNs(b, o.Empty(), frames))
				n = append(n, cycleNs(b, o.Ingress(), frames))
				nc = append(nc, cycleNs(b, onc.Ingress(), frames))
				be = append(be, cycleNs(b, before, frames))
				o.Close()
				onc.Close()
			}
			for i, x := range [][]float64{e, n, nc, be} {
				slices.Sort(x)
				b.ReportMetric(x[len(x)/2], []string{"empty", "this", "table", "before"}[i]+"_ns")
			}
		})
	}
}
