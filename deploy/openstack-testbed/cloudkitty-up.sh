#!/usr/bin/env bash
# deploy/openstack-testbed/cloudkitty-up.sh STATE_DIR — add CloudKitty 17 and
# Prometheus 2.42 (Debian 12's packages, install.sh) to a testbed that up.sh
# started in STATE_DIR, wired to its real Keystone:
#
#   prometheus            remote-write receiver on, out_of_order_time_window 7d
#                         (closed hours arrive after the head moved on), no
#                         scrapes, 127.0.0.1 only
#   influxd               InfluxDB 1.6: CloudKitty's v2 storage (v1 sqlalchemy
#                         storage cannot delete, so a reprocess would add the
#                         hour twice; see docs/billing.md), 127.0.0.1 only
#   cloudkitty-api        Keystone auth (keystonemiddleware), catalog type
#                         "rating" (internal = real URL, public = closed port)
#   cloudkitty-processor  collector prometheus, fetcher keystone (projects where
#                         the cloudkitty user holds the "rating" role), period
#                         3600, deploy/cloudkitty/metrics.yml as shipped
#
# Keystone gets a "cloudkitty" user in project "service" with role admin and
# the "rating" role. The processor rates once at start, then sleeps one
# period (3600 s, CloudKitty's loop): restart it with
#   service.sh STATE_DIR stop|start cloudkitty-processor
# after adding projects or scheduling a reprocess. A scope's first period is
# the month's start unless set: lib/cloudkitty_scope.py.
#
# Appends to STATE_DIR/env (PROMETHEUS_URL, CLOUDKITTY_URL, INFLUXDB_URL,
# CLOUDKITTY_CONF), STATE_DIR/pids and cmd/ (down.sh and service.sh handle
# them). Prints a timing line per step.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
S=$(realpath -m "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=/usr/bin/python3
"$HERE/install.sh" --check
[[ -f $S/env ]] || { echo "$0: $S/env missing: run up.sh $S first" >&2; exit 1; }
if grep -q '^CLOUDKITTY_URL=' "$S/env"; then
	echo "$0: CloudKitty already set up in $S" >&2
	exit 1
fi
# shellcheck disable=SC1091
. "$S/env"
umask 077
mkdir -p "$S"/{prometheus/data,influxdb,cloudkitty/locks,cmd,log,lock}
t0=$(date +%s.%N)
el() { printf 'cloudkitty-testbed: %5.1fs %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$*"; }
fail() {
	echo "cloudkitty-testbed: $*" >&2
	for f in "$S"/log/{prometheus,influxd,cloudkitty-api,cloudkitty-processor,cloudkitty-setup}.log; do
		[[ -f $f ]] && { echo "--- tail $f" >&2; tail -n 20 "$f" >&2; }
	done
	exit 1
}
wait_http() { # URL NAME
	for _ in $(seq 1 480); do curl -s -o /dev/null --max-time 2 "$1" && return 0; sleep 0.25; done
	fail "$2 did not answer on $1 within 120s"
}
# bg NAME CMD...: as up.sh (own process group, cmd/NAME for service.sh), but
# cmd/NAME execs: cloudkitty-processor (cotyledon) calls setsid(), which
# would take it out of the process group service.sh and down.sh signal
# unless it already leads its own session.
bg() {
	local name=$1
	shift
	{
		printf 'export PYTHONPATH=%q\n' ""
		printf 'exec '
		printf '%q ' "$@"
		echo
	} >"$S/cmd/$name"
	setsid "$@" >>"$S/log/$name.log" 2>&1 </dev/null &
	echo "$! $name" >>"$S/pids"
}
read -r PROM_PORT INFLUX_PORT INFLUX_RPC_PORT CK_PORT < <($PY "$HERE/lib/freeports.py" 4)
DEAD_PORT=9
PROM=http://127.0.0.1:$PROM_PORT
INFLUX=http://127.0.0.1:$INFLUX_PORT
CK=http://127.0.0.1:$CK_PORT
CK_PASSWORD=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')

# ---------- Prometheus ----------
cat >"$S/prometheus/prometheus.yml" <<CONF
global:
  evaluation_interval: 1h
storage:
  tsdb:
    # tapflow publishes an hour after it closed and corrections up to days
    # later: accept samples this much older than the head
    out_of_order_time_window: 7d
CONF
bg prometheus /usr/bin/prometheus --config.file="$S/prometheus/prometheus.yml" \
	--storage.tsdb.path="$S/prometheus/data" --storage.tsdb.retention.time=30d \
	--web.listen-address="127.0.0.1:$PROM_PORT" --web.enable-remote-write-receiver

# ---------- InfluxDB 1.6 (CloudKitty v2 storage) ----------
cat >"$S/influxdb/influxdb.conf" <<CONF
reporting-disabled = true
bind-address = "127.0.0.1:$INFLUX_RPC_PORT"
[meta]
  dir = "$S/influxdb/meta"
[data]
  dir = "$S/influxdb/data"
  wal-dir = "$S/influxdb/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:$INFLUX_PORT"
  log-enabled = false
[continuous_queries]
  enabled = false
CONF
bg influxd /usr/bin/influxd -config "$S/influxdb/influxdb.conf"

# ---------- Keystone: user, role, catalog ----------
# SQLite in WAL mode: oslo.db sessions that are never closed keep a read
# transaction open until Python's garbage collector ends them; with the
# default rollback journal that read lock makes every other write fail
# with "database is locked" (Keystone's writes, and CloudKitty's api vs
# processor). In WAL mode readers never block a writer. Set while
# Keystone is stopped (journal_mode needs the file to itself).
"$HERE/service.sh" "$S" stop keystone
sqlite3 "$S/keystone/keystone.db" 'PRAGMA journal_mode=WAL;' >/dev/null || fail "keystone.db: journal_mode=WAL failed"
"$HERE/service.sh" "$S" start keystone
wait_http "$KEYSTONE_URL/v3" keystone
AUTH='{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"admin","domain":{"id":"default"},"password":"'"$OS_PASSWORD"'"}}},"scope":{"project":{"name":"admin","domain":{"id":"default"}}}}}'
TOKEN=$(curl -sf -D - -o /dev/null -H 'Content-Type: application/json' -X POST "$KEYSTONE_URL/v3/auth/tokens" -d "$AUTH" |
	awk 'tolower($1)=="x-subject-token:"{print $2}' | tr -d '\r')
[[ -n $TOKEN ]] || fail "keystone: admin token not issued"
# ks METHOD PATH [BODY]: a Keystone admin call. Should a write still fail
# with "database is locked" (HTTP 500), restart Keystone (service.sh),
# which ends its open transactions, and retry.
ks() {
	local out
	for _ in 1 2 3 4; do
		if out=$(curl -sf -H 'Content-Type: application/json' -H "X-Auth-Token: $TOKEN" -X "$1" "$KEYSTONE_URL/v3$2" ${3:+-d "$3"}); then
			printf '%s' "$out"
			return 0
		fi
		echo "cloudkitty-testbed: keystone $1 $2 failed; restarting keystone (SQLite lock)" >&2
		"$HERE/service.sh" "$S" stop keystone && "$HERE/service.sh" "$S" start keystone
		wait_http "$KEYSTONE_URL/v3" keystone
	done
	fail "keystone: $1 $2 failed"
}
SERVICE_PROJECT=$(ks GET '/projects?name=service' | jq -r '.projects[0].id // empty')
[[ -n $SERVICE_PROJECT ]] || SERVICE_PROJECT=$(ks POST /projects '{"project":{"name":"service","domain_id":"default"}}' | jq -r .project.id)
CK_USER=$(ks POST /users '{"user":{"name":"cloudkitty","domain_id":"default","password":"'"$CK_PASSWORD"'"}}' | jq -r .user.id)
ADMIN_ROLE=$(ks GET '/roles?name=admin' | jq -r '.roles[0].id')
RATING_ROLE=$(ks POST /roles '{"role":{"name":"rating"}}' | jq -r .role.id)
ks PUT "/projects/$SERVICE_PROJECT/users/$CK_USER/roles/$ADMIN_ROLE" >/dev/null
ks PUT "/projects/$SERVICE_PROJECT/users/$CK_USER/roles/$RATING_ROLE" >/dev/null
SID=$(ks POST /services '{"service":{"type":"rating","name":"cloudkitty"}}' | jq -r .service.id)
ks POST /endpoints '{"endpoint":{"service_id":"'"$SID"'","interface":"internal","url":"'"$CK"'","region_id":"RegionOne"}}' >/dev/null
ks POST /endpoints '{"endpoint":{"service_id":"'"$SID"'","interface":"public","url":"http://127.0.0.1:'"$DEAD_PORT"'","region_id":"RegionOne"}}' >/dev/null
el "keystone: cloudkitty user, rating role, catalog entry"

# ---------- CloudKitty ----------
cp "$REPO/deploy/cloudkitty/metrics.yml" "$S/cloudkitty/metrics.yml"
KSAUTH="auth_type = password
auth_url = $KEYSTONE_URL/v3
username = cloudkitty
password = $CK_PASSWORD
project_name = service
user_domain_id = default
project_domain_id = default
region_name = RegionOne"
cat >"$S/cloudkitty/cloudkitty.conf" <<CONF
[DEFAULT]
auth_strategy = keystone
# only the API's scope-reset cast uses RPC; nothing else crosses processes
transport_url = fake:/
# logs go to stderr: bg writes them to log/NAME.log
use_stderr = true
api_paste_config = /etc/cloudkitty/api_paste.ini
[database]
connection = sqlite:///$S/cloudkitty/cloudkitty.db?timeout=30
[keystone_authtoken]
www_authenticate_uri = $KEYSTONE_URL/v3
interface = internal
$KSAUTH
[fetcher]
backend = keystone
[fetcher_keystone]
keystone_version = 3
interface = internal
$KSAUTH
[collect]
collector = prometheus
period = 3600
# CloudKitty's default: the period starting at H is rated once now > H +
# wait_periods x period, i.e. from H+2h, an hour after it ended; tapflow
# publishes H at H+1h+billing.settle (11m10s by default)
wait_periods = 2
metrics_conf = $S/cloudkitty/metrics.yml
scope_key = project_id
[collector_prometheus]
# the collector appends /query to this
prometheus_url = $PROM/api/v1
[storage]
version = 2
backend = influxdb
[storage_influxdb]
host = 127.0.0.1
port = $INFLUX_PORT
database = cloudkitty
[orchestrator]
coordination_url = file://$S/cloudkitty/locks
max_workers = 1
max_workers_reprocessing = 1
max_threads = 4
[oslo_concurrency]
lock_path = $S/lock
CONF
CKCONF=(--config-file "$S/cloudkitty/cloudkitty.conf")
cloudkitty-dbsync "${CKCONF[@]}" upgrade >"$S/log/cloudkitty-setup.log" 2>&1 || fail "cloudkitty-dbsync failed (log/cloudkitty-setup.log)"
sqlite3 "$S/cloudkitty/cloudkitty.db" 'PRAGMA journal_mode=WAL;' >/dev/null || fail "cloudkitty.db: journal_mode=WAL failed" # as keystone.db above
wait_http "$INFLUX/ping" influxd
curl -sf -X POST "$INFLUX/query" --data-urlencode 'q=CREATE DATABASE cloudkitty' >/dev/null || fail "influxdb: CREATE DATABASE failed"
cloudkitty-storage-init "${CKCONF[@]}" >>"$S/log/cloudkitty-setup.log" 2>&1 || fail "cloudkitty-storage-init failed (log/cloudkitty-setup.log)"
el "cloudkitty db and storage ready"
bg cloudkitty-api /usr/bin/cloudkitty-api --host 127.0.0.1 --port "$CK_PORT" -- "${CKCONF[@]}"
bg cloudkitty-processor /usr/bin/cloudkitty-processor "${CKCONF[@]}"
cat >>"$S/env" <<ENV
PROMETHEUS_URL=$PROM
INFLUXDB_URL=$INFLUX
CLOUDKITTY_URL=$CK
CLOUDKITTY_CONF=$S/cloudkitty/cloudkitty.conf
ENV
wait_http "$PROM/-/ready" prometheus
wait_http "$CK/" cloudkitty-api
el "prometheus, cloudkitty-api and cloudkitty-processor up (endpoints in $S/env)"
