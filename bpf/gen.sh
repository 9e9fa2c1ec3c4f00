#!/usr/bin/env bash
# bpf/gen.sh — rebuild or check the committed bpf2go output.
#
#   bpf/gen.sh          regenerate flow_bpfel.go / flow_bpfel.o
#   bpf/gen.sh check    regenerate into a scratch copy and fail if the
#                       committed files differ (CI: stale output)
#
# Needs Debian's clang (14), llvm-strip and libbpf-dev (bpf/bpf_helpers.h);
# the output is byte-reproducible with those.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd .. && pwd)

for tool in clang llvm-strip; do
	command -v "$tool" >/dev/null || { echo "bpf/gen.sh: $tool missing: apt-get install clang llvm libbpf-dev" >&2; exit 1; }
done
[[ -f /usr/include/bpf/bpf_helpers.h ]] || { echo "bpf/gen.sh: libbpf headers missing: apt-get install libbpf-dev" >&2; exit 1; }

if [[ "${1:-}" != check ]]; then
	exec go generate ./
fi

# Generate in a scratch directory inside the module, so `go tool bpf2go`
# resolves the tool pinned in go.mod.
scratch="$root/bpf/.gencheck"
rm -rf "$scratch"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
cp flow.bpf.c flow.h gen.go "$scratch"/
(cd "$scratch" && go generate ./ >/dev/null)
status=0
for f in flow_bpfel.go flow_bpfel.o; do
	if ! cmp -s "$f" "$scratch/$f"; then
		echo "bpf/$f is stale: run 'make generate' (bpf/gen.sh) and commit the result" >&2
		status=1
	fi
done
exit $status
