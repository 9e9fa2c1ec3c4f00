package bpf

// The only go:generate of the capture: compile flow.bpf.c with Debian's clang
// and emit flow_bpfel.go / flow_bpfel.o (committed; `make generate-check`
// fails when they are stale).
//go:generate go tool bpf2go -tags linux -go-package bpf -target bpfel -type flow_key -type flow_key4 -type flow_key6 -type flow_val -type flow_ent -type flow_record -type meter -type sweep_args -type flow_cent -type cache_state -type flush_args flow flow.bpf.c -- -I/usr/include/x86_64-linux-gnu -O2 -g -mcpu=v3 -Wall -Werror
