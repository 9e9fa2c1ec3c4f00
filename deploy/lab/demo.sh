#!/usr/bin/env bash
# deploy/lab/demo.sh BIN DATA_DIR — what `make demo` runs as root.
# As root: the demo cloud in network namespaces (deploy/lab/demo.yaml), real
# HAProxy/keepalived/nftables, `tapflow run` (source: ebpf) on its taps in
# the hypervisor namespace, a mix of real traffic and a failover, a graceful
# stop, the tenant × zone × direction × external_network table read back
# from Parquet with its checks and conservation, then teardown.
# Without root it says so and runs the synthetic demo instead.
set -euo pipefail
bin=${1:-bin/tapflow} data=${2:-demo-data/lab}

if [[ $(id -u) -ne 0 ]]; then
	echo "demo: not root — network namespaces and eBPF need root; running the synthetic demo instead"
	exec deploy/scripts/demo.sh "$bin" "${data%/lab}" 20
fi

need=()
for p in ip:iproute2 nft:nftables haproxy:haproxy keepalived:keepalived; do
	command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
	echo "==> installing ${need[*]} (Debian)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$data"
echo "==> tapflow lab scenario demo: up → tapflow run in tfldemo-hv → traffic → SIGTERM → Parquet → checks → down"
echo "    (the cloud: deploy/lab/demo.yaml; the traffic and the expected table: deploy/lab/scenarios/demo.yaml)"
status=0
"$bin" lab scenario --prefix tfldemo --data "$data" demo || status=$?
echo
if [[ -d "$data/demo/flows" ]]; then
	names=()
	[[ -f $data/demo/inventory.yaml ]] && names=(--names "$data/demo/inventory.yaml")
	"$bin" report --data "$data/demo" --by tenant,zone,direction,external_network "${names[@]}" || true
	echo
	echo "Parquet files: $data/demo/flows/dt=YYYY-MM-DD/hour=HH/*.parquet (meters: $data/demo/meters/)"
	echo "tapflow's log: $data/demo/tapflow.log   its config: $data/demo/tapflow.yaml   the lab's inventory: $data/demo/inventory.yaml"
	echo "Query them:    duckdb -c \"SELECT tenant_id, zone, direction, external_network, sum(bytes) FROM read_parquet('$data/demo/flows/**/*.parquet', hive_partitioning=true) GROUP BY ALL ORDER BY 5 DESC\""
fi
exit $status
