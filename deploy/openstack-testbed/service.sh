#!/usr/bin/env bash
# deploy/openstack-testbed/service.sh STATE_DIR stop|start NAME — stop or
# (re)start one server of a running testbed (e.g. neutron-server, to test an
# API outage), with the command up.sh used. start does not wait for the
# server to answer.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 STATE_DIR stop|start NAME" >&2; exit 2; }
S=$(realpath -m "$1")
action=$2 name=$3
[[ -f $S/cmd/$name ]] || { echo "$0: no server $name in $S (see $S/cmd/)" >&2; exit 1; }
case $action in
stop)
	pid=$(awk -v n="$name" '$2 == n {print $1}' "$S/pids")
	[[ -n $pid ]] || exit 0
	kill -TERM -- "-$pid" 2>/dev/null || true
	for _ in $(seq 1 40); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.25; done
	kill -KILL -- "-$pid" 2>/dev/null || true
	awk -v n="$name" '$2 != n' "$S/pids" >"$S/pids.new" && mv "$S/pids.new" "$S/pids"
	;;
start)
	if awk -v n="$name" '$2 == n {f=1} END {exit !f}' "$S/pids"; then
		echo "$0: $name is running; stop it first" >&2
		exit 1
	fi
	# shellcheck disable=SC1090
	setsid bash -c ". $(printf %q "$S/cmd/$name")" >>"$S/log/$name.log" 2>&1 </dev/null &
	echo "$! $name" >>"$S/pids"
	;;
*)
	echo "usage: $0 STATE_DIR stop|start NAME" >&2
	exit 2
	;;
esac
