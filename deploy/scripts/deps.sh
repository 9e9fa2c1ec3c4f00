#!/usr/bin/env bash
# deploy/scripts/deps.sh — install what `make test` and `make generate` need
# on a fresh Debian machine. Idempotent: a no-op (well under a second) when
# everything is present. Without root it only reports what is missing; the
# tests that need those parts (eBPF, namespaces) skip themselves then.
set -euo pipefail

need=()
command -v clang >/dev/null || need+=(clang)
command -v llvm-strip >/dev/null || need+=(llvm)
[[ -f /usr/include/bpf/bpf_helpers.h ]] || need+=(libbpf-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v bpftool >/dev/null || need+=(bpftool)
# the namespace lab (make demo as root, lab acceptance suite)
command -v nft >/dev/null || need+=(nftables)
command -v haproxy >/dev/null || need+=(haproxy)
command -v keepalived >/dev/null || need+=(keepalived)
# the systemd units and the Debian package (internal/testkit/install):
# systemd-analyze verify/security work without systemd as PID 1
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v adduser >/dev/null || need+=(adduser)
command -v setpriv >/dev/null || need+=(util-linux)
# the container image and its test (deploy/container): podman builds and
# runs it, runc is the runtime the test uses (as Docker and containerd do)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
# promtool: check and unit-test the alert and recording rules (deploy/prometheus)
command -v promtool >/dev/null || need+=(prometheus)
# the Prometheus server itself (same package): the billing tests write to it
# (remote write) and query it as CloudKitty does (internal/testkit/promserver)
command -v prometheus >/dev/null || [[ " ${need[*]} " == *" prometheus "* ]] || need+=(prometheus)
# the JavaScript example subscriber (examples/js-subscriber, run by test-go)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
# Debian 12's nats-server (2.9.10, the oldest supported): the delivery chaos
# test and transport tests run against it too (Debian installs it in /usr/sbin)
[[ -x /usr/sbin/nats-server ]] || need+=(nats-server)
# the terminal test of tapflow top (renders under a real tmux pane)
command -v tmux >/dev/null || need+=(tmux)

if ((${#need[@]} == 0)); then
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "deps: missing Debian packages: ${need[*]} (not root: not installing; the tests that need them skip, or fail with CI set)" >&2
	exit 0
fi
echo "deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# the tests run nats-server themselves; Debian's package starts a system
# one on 127.0.0.1:4222, which nothing here wants
if [[ " ${need[*]} " == *" nats-server "* ]]; then
	systemctl disable --now nats-server >/dev/null 2>&1 || true
fi
