#!/usr/bin/env bash
# deploy/openstack-testbed/down.sh STATE_DIR — stop what up.sh started there:
# each process group listed in STATE_DIR/pids (SIGTERM, then SIGKILL after
# 10 s), RabbitMQ's node and its epmd (by their own port). Idempotent; leaves
# STATE_DIR in place (logs, databases) for inspection.
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
S=$(realpath -m "$1")
[[ -s $S/pids ]] || exit 0
if [[ -f $S/env ]]; then
	RABBIT_NODENAME=$(sed -n 's/^RABBIT_NODENAME=//p' "$S/env")
	EPMD_PORT=$(sed -n 's/^ERL_EPMD_PORT=//p' "$S/env")
fi
mapfile -t entries <"$S/pids"
for e in "${entries[@]}"; do
	kill -TERM -- "-${e%% *}" 2>/dev/null || true
done
for _ in $(seq 1 40); do
	alive=0
	for e in "${entries[@]}"; do kill -0 -- "-${e%% *}" 2>/dev/null && alive=1; done
	((alive == 0)) && break
	sleep 0.25
done
for e in "${entries[@]}"; do kill -KILL -- "-${e%% *}" 2>/dev/null || true; done
# epmd daemonizes out of rabbit's process group; stop the one on our port.
if [[ -n ${EPMD_PORT:-} ]]; then
	ERL_EPMD_PORT=$EPMD_PORT /usr/lib/erlang/erts-*/bin/epmd -kill >/dev/null 2>&1 || true
fi
: >"$S/pids"
