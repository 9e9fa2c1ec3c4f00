# bpf/bpf.mk — included by the top-level Makefile.
#
#   make bpf-generate   rebuild bpf/flow_bpfel.{go,o} with Debian clang
#   make bpf-check      fail when the committed output is stale (CI)
#   make bpf-deps       the Debian packages the build and tests need
#
# Hook into the project targets with e.g.
#   generate: bpf-generate
#   check: bpf-check

BPF_APT_PACKAGES := clang llvm libbpf-dev iproute2

.PHONY: bpf-generate bpf-check bpf-deps
bpf-generate:
	bpf/gen.sh

bpf-check:
	bpf/gen.sh check

bpf-deps:
	@command -v clang >/dev/null && command -v llvm-strip >/dev/null && test -f /usr/include/bpf/bpf_helpers.h && command -v ip >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BPF_APT_PACKAGES))
