// Package bpf holds tapflow's kernel side: the tc flow program (flow.bpf.c),
// the header that is the kernel↔Go contract (flow.h), the committed bpf2go
// output (flow_bpfel.go, flow_bpfel.o), and the loader that sizes its maps
// from configuration.
//
// The program is attached to both directions of every VM tap (see
// bpf/attach); it aggregates IP frames into a shared flow table keyed by
// (ifindex, direction, MACs, VLAN, ethertype, IPs, protocol, ports or ICMP
// type/code) and exports records through a BPF ring buffer on FIN/RST, on
// the active timeout, when a packet finds no table slot (overflow), and when
// userspace sweeps idle flows (Objects.Sweep). Per-CPU meters count every
// frame per interface slot and direction, and every byte the ring buffer
// refused, so that Σ record bytes = meter bytes − lost bytes.
//
// With Spec.PinDir the maps are pinned in bpffs and adopted by the next
// load (pin.go); Ring reads the ring buffer without consuming it until
// Commit (ring.go).
//
// Regenerate with `make generate` (Debian clang 14, -mcpu=v3); bpf/gen.sh
// check fails when the committed output is stale.
package bpf
