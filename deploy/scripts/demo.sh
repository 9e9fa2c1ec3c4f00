#!/usr/bin/env bash
# deploy/scripts/demo.sh BIN DATA_DIR SECONDS — what `make demo-synthetic`
# (and `make demo` when not root) runs:
# tapflow run on synthetic flows for SECONDS, stopped with SIGINT (the
# graceful path: drain, commit, ack), then a report read back from Parquet.
set -euo pipefail
bin=$1 data=$2 secs=${3:-20}
rm -rf "$data"
mkdir -p "$data"
echo "==> tapflow run for ${secs}s (synthetic source → enrich → Arrow → embedded NATS JetStream → Parquet)"
echo "    logs: $data/tapflow.log"
"$bin" run --config deploy/examples/demo.yaml --data-dir "$data" --node demo-node >"$data/tapflow.log" 2>&1 &
pid=$!
for ((i = 1; i <= secs; i++)); do
	sleep 1
	kill -0 "$pid" 2>/dev/null || { echo "tapflow exited early:"; tail -20 "$data/tapflow.log"; exit 1; }
	((i % 5 == 0)) && echo "    ${i}s: $(find "$data/flows" -name '*.parquet' 2>/dev/null | wc -l) Parquet files committed"
done
echo "==> SIGINT: graceful stop (agent publishes what it holds, collector drains the stream and commits)"
kill -INT "$pid"
wait "$pid" || { echo "tapflow exited with an error:"; tail -20 "$data/tapflow.log"; exit 1; }
grep -E "level=(WARN|ERROR)" "$data/tapflow.log" | head -5 || true
echo
"$bin" report --data "$data"
echo
echo "Parquet files: $data/flows/dt=YYYY-MM-DD/hour=HH/*.parquet"
echo "Query them:    duckdb -c \"SELECT tenant_id, zone, direction, sum(bytes) FROM read_parquet('$data/flows/**/*.parquet', hive_partitioning=true) GROUP BY ALL ORDER BY 4 DESC\""
