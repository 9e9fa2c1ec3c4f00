#!/usr/bin/env bash
# deploy/openstack-testbed/up.sh STATE_DIR — start a real OpenStack control
# plane on 127.0.0.1 as child processes, all state in STATE_DIR:
#
#   keystone-wsgi-public   Keystone 22 (Zed), SQLite, fernet; admin/ADMIN_PASSWORD
#   neutron-server         Neutron 21, noauth, SQLite, ml2 with no mechanism drivers
#   nova-api               Nova 26, noauth2, SQLite (servers seeded by lib/nova_servers.py)
#   octavia-api + worker   Octavia 11, noauth, amphora provider with the noop amphora
#                          driver, the allowed-address-pairs network driver against
#                          the real Neutron and lib/octavia-plugin's compute driver, so
#                          amphora ports are real Neutron ports bound to a compute id
#   rabbitmq-server        only Octavia's api -> worker cast needs a real bus
#
# The API servers run without token validation (noauth); Keystone is real
# and its catalog lists them (internal interface: the real URLs; public
# interface: a closed port, so a client on the wrong interface fails).
#
# Ports are free ports chosen at start (override with KEYSTONE_PORT,
# NEUTRON_PORT, NOVA_PORT, OCTAVIA_PORT, RABBIT_PORT). Writes:
#   STATE_DIR/env     endpoints and credentials, sourceable (KEY=value lines)
#   STATE_DIR/pids    "PID NAME" per started process group, for down.sh
#   STATE_DIR/log/    one log per server
# Needs the packages of install.sh. Prints a timing line per step.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
S=$(realpath -m "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3 # Debian's python: the OpenStack libraries live there, not in a pyenv python3
"$HERE/install.sh" --check
if [[ -s $S/pids ]]; then
	echo "$0: $S/pids exists: a testbed may be running there; run down.sh $S first" >&2
	exit 1
fi
mkdir -p "$S"/{keystone,neutron,nova,octavia,rabbit,log,lock,certs}
: >"$S/pids"
t0=$(date +%s.%N)
el() { printf 'openstack-testbed: %5.1fs %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$*"; }
fail() {
	echo "openstack-testbed: $*" >&2
	for f in "$S"/log/*.log; do echo "--- tail $f" >&2; tail -n 15 "$f" >&2; done
	"$HERE/down.sh" "$S" >&2 || true
	exit 1
}
wait_http() { # URL NAME
	for _ in $(seq 1 480); do curl -s -o /dev/null --max-time 2 "$1" && return 0; sleep 0.25; done
	fail "$2 did not answer on $1 within 120s"
}
wait_tcp() { # PORT NAME
	for _ in $(seq 1 480); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.25; done
	fail "$2 did not listen on 127.0.0.1:$1 within 120s"
}
# bg NAME CMD...: start CMD in its own process group (setsid), log to log/NAME.log
# The command is kept in STATE_DIR/cmd/NAME so service.sh can restart it.
bg() {
	local name=$1
	shift
	mkdir -p "$S/cmd"
	{
		printf 'export PYTHONPATH=%q\n' "${PYTHONPATH:-}"
		printf '%q ' "$@"
		echo
	} >"$S/cmd/$name"
	setsid "$@" >>"$S/log/$name.log" 2>&1 </dev/null &
	echo "$! $name" >>"$S/pids"
}

# ---------- ports ----------
read -r p1 p2 p3 p4 p5 p6 p7 < <($PY "$HERE/lib/freeports.py" 7)
KEYSTONE_PORT=${KEYSTONE_PORT:-$p1}
NEUTRON_PORT=${NEUTRON_PORT:-$p2}
NOVA_PORT=${NOVA_PORT:-$p3}
OCTAVIA_PORT=${OCTAVIA_PORT:-$p4}
RABBIT_PORT=${RABBIT_PORT:-$p5}
RABBIT_DIST_PORT=$p6
EPMD_PORT=$p7
DEAD_PORT=9 # public-interface catalog URLs point here: nothing listens (discard port, closed)
ADMIN_PASSWORD=${ADMIN_PASSWORD:-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}
KS=http://127.0.0.1:$KEYSTONE_PORT
NEUTRON=http://127.0.0.1:$NEUTRON_PORT
NOVA=http://127.0.0.1:$NOVA_PORT/v2.1
OCTAVIA=http://127.0.0.1:$OCTAVIA_PORT
cat >"$S/env" <<ENV
TESTBED_STATE=$S
OS_AUTH_URL=$KS/v3
OS_USERNAME=admin
OS_PASSWORD=$ADMIN_PASSWORD
OS_PROJECT_NAME=admin
OS_USER_DOMAIN_ID=default
OS_PROJECT_DOMAIN_ID=default
OS_REGION_NAME=RegionOne
KEYSTONE_URL=$KS
NEUTRON_URL=$NEUTRON
NOVA_URL=$NOVA
OCTAVIA_URL=$OCTAVIA
NOVA_CONF=$S/nova/nova.conf
RABBIT_NODENAME=tapflow$RABBIT_PORT@localhost
ERL_EPMD_PORT=$EPMD_PORT
ENV
chmod 600 "$S/env"

# ---------- RabbitMQ ----------
RABBIT_ENV=(RABBITMQ_NODENAME="tapflow$RABBIT_PORT@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	RABBITMQ_NODE_PORT="$RABBIT_PORT" RABBITMQ_DIST_PORT="$RABBIT_DIST_PORT" ERL_EPMD_ADDRESS=127.0.0.1
	ERL_EPMD_PORT="$EPMD_PORT" RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
	RABBITMQ_MNESIA_BASE="$S/rabbit/mnesia" RABBITMQ_LOG_BASE="$S/rabbit/log"
	RABBITMQ_ENABLED_PLUGINS_FILE="$S/rabbit/enabled_plugins" RABBITMQ_PID_FILE="$S/rabbit/rabbit.pid" HOME="$S/rabbit")
echo '[].' >"$S/rabbit/enabled_plugins"
bg rabbitmq env "${RABBIT_ENV[@]}" /usr/lib/rabbitmq/bin/rabbitmq-server

# ---------- Keystone ----------
cat >"$S/keystone/keystone.conf" <<CONF
[DEFAULT]
log_file = $S/log/keystone-manage.log
[database]
connection = sqlite:///$S/keystone/keystone.db
[token]
provider = fernet
[fernet_tokens]
key_repository = $S/keystone/fernet-keys
[fernet_receipts]
key_repository = $S/keystone/fernet-receipts
[credential]
key_repository = $S/keystone/credential-keys
[oslo_concurrency]
lock_path = $S/lock
CONF
KCONF=(--config-file "$S/keystone/keystone.conf")
(
	keystone-manage "${KCONF[@]}" db_sync &&
		keystone-manage "${KCONF[@]}" fernet_setup --keystone-user root --keystone-group root &&
		keystone-manage "${KCONF[@]}" credential_setup --keystone-user root --keystone-group root &&
		keystone-manage "${KCONF[@]}" bootstrap --bootstrap-password "$ADMIN_PASSWORD" \
			--bootstrap-region-id RegionOne --bootstrap-admin-url "$KS/v3" \
			--bootstrap-internal-url "$KS/v3" --bootstrap-public-url "$KS/v3"
) >"$S/log/keystone-setup.log" 2>&1 &
KS_SETUP=$!

# ---------- Neutron ----------
cat >"$S/neutron/neutron.conf" <<CONF
[DEFAULT]
auth_strategy = noauth
core_plugin = ml2
service_plugins = router
bind_host = 127.0.0.1
bind_port = $NEUTRON_PORT
transport_url = fake:/
api_workers = 0
rpc_workers = 0
rpc_state_report_workers = 0
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
dhcp_agent_notification = false
state_path = $S/neutron
api_paste_config = /etc/neutron/api-paste.ini
[database]
# timeout: SQLite's busy wait (default 5 s); a concurrent writer (RPC
# workers, Octavia's cascade deletes) otherwise surfaces as HTTP 500
# "database is locked"
connection = sqlite:///$S/neutron/neutron.db?timeout=30
[oslo_concurrency]
lock_path = $S/lock
CONF
cat >"$S/neutron/ml2_conf.ini" <<CONF
[ml2]
type_drivers = flat,vlan,vxlan
tenant_network_types = vxlan
mechanism_drivers =
extension_drivers = port_security
[ml2_type_flat]
flat_networks = *
[ml2_type_vlan]
network_vlan_ranges = physnet1:100:200
[ml2_type_vxlan]
vni_ranges = 1:1000
CONF
NCONF=(--config-file "$S/neutron/neutron.conf" --config-file "$S/neutron/ml2_conf.ini")
# alembic migrations cannot ALTER constraints on SQLite: build the schema
# from the models (as Neutron's own unit tests do), then stamp it.
$PY "$HERE/lib/schema.py" neutron "sqlite:///$S/neutron/neutron.db" >"$S/log/neutron-schema.log" 2>&1 ||
	fail "neutron schema failed (log/neutron-schema.log)"
neutron-db-manage "${NCONF[@]}" stamp heads >"$S/log/neutron-stamp.log" 2>&1 || fail "neutron-db-manage stamp failed"
bg neutron-server neutron-server "${NCONF[@]}"
el "neutron schema done, neutron-server starting on $NEUTRON"

# ---------- Nova API (its SQLite migrations work) ----------
cat >"$S/nova/nova.conf" <<CONF
[DEFAULT]
transport_url = fake:/
enabled_apis = osapi_compute
osapi_compute_listen = 127.0.0.1
osapi_compute_listen_port = $NOVA_PORT
osapi_compute_workers = 1
state_path = $S/nova
[api]
auth_strategy = noauth2
[api_database]
connection = sqlite:///$S/nova/nova_api.db
[database]
connection = sqlite:///$S/nova/nova.db
[oslo_concurrency]
lock_path = $S/lock
[wsgi]
api_paste_config = /etc/nova/api-paste.ini
[neutron]
# servers/detail asks Neutron for security groups
auth_type = none
endpoint_override = $NEUTRON
CONF
NOVA_CONF=(--config-file "$S/nova/nova.conf")
(
	nova-manage "${NOVA_CONF[@]}" api_db sync &&
		nova-manage "${NOVA_CONF[@]}" cell_v2 map_cell0 --database_connection "sqlite:///$S/nova/nova_cell0.db" &&
		nova-manage "${NOVA_CONF[@]}" db sync &&
		nova-manage "${NOVA_CONF[@]}" cell_v2 create_cell --name cell1 --database_connection "sqlite:///$S/nova/nova.db" --transport-url fake:/
) >"$S/log/nova-manage.log" 2>&1 &
NOVA_DB=$!

# ---------- Octavia ----------
openssl req -x509 -newkey rsa:2048 -days 3650 -keyout "$S/certs/ca.key" -out "$S/certs/ca.pem" \
	-subj '/CN=tapflow-testbed-octavia-ca' -passout pass:testpass 2>/dev/null
openssl rsa -in "$S/certs/ca.key" -passin pass:testpass 2>/dev/null | cat "$S/certs/ca.pem" - >"$S/certs/client.pem"
$PY "$HERE/lib/schema.py" octavia "sqlite:///$S/octavia/octavia.db" >"$S/log/octavia-schema.log" 2>&1 ||
	fail "octavia schema failed (log/octavia-schema.log)"
wait_http "$NEUTRON/v2.0/networks" neutron-server
el "neutron-server up"
H=(-H 'Content-Type: application/json' -H 'X-Auth-Token: testbed')
MGMT=$(curl -sf "${H[@]}" -X POST "$NEUTRON/v2.0/networks" -d '{"network":{"name":"lb-mgmt-net","project_id":"service"}}' | jq -r .network.id)
curl -sf "${H[@]}" -X POST "$NEUTRON/v2.0/subnets" \
	-d '{"subnet":{"name":"lb-mgmt-subnet","network_id":"'"$MGMT"'","ip_version":4,"cidr":"172.31.0.0/24","project_id":"service"}}' >/dev/null ||
	fail "creating lb-mgmt-net failed"
cat >"$S/octavia/octavia.conf" <<CONF
[DEFAULT]
transport_url = rabbit://guest:guest@127.0.0.1:$RABBIT_PORT/
[api_settings]
bind_host = 127.0.0.1
bind_port = $OCTAVIA_PORT
auth_strategy = noauth
enabled_provider_drivers = amphora:Amphora driver (test compute),noop_driver:No-op driver
default_provider_driver = amphora
[database]
connection = sqlite:///$S/octavia/octavia.db?timeout=30
[controller_worker]
amphora_driver = amphora_noop_driver
compute_driver = neutron_port_compute_driver
network_driver = allowed_address_pairs_driver
image_driver = image_noop_driver
volume_driver = volume_noop_driver
loadbalancer_topology = ACTIVE_STANDBY
amp_boot_network_list = $MGMT
amp_image_tag = amphora
amp_flavor_id = 1
client_ca = $S/certs/ca.pem
workers = 1
[certificates]
cert_generator = local_cert_generator
ca_certificate = $S/certs/ca.pem
ca_private_key = $S/certs/ca.key
ca_private_key_passphrase = testpass
server_certs_key_passphrase = insecure-key-do-not-use-this-key
[haproxy_amphora]
client_cert = $S/certs/client.pem
server_ca = $S/certs/ca.pem
[service_auth]
auth_type = none
[neutron]
endpoint = $NEUTRON
[oslo_concurrency]
lock_path = $S/lock
[task_flow]
jobboard_enabled = false
CONF
octavia-db-manage --config-file "$S/octavia/octavia.conf" stamp head >"$S/log/octavia-stamp.log" 2>&1 || fail "octavia-db-manage stamp failed"
export PYTHONPATH=$HERE/lib/octavia-plugin # the test compute driver's entry point
bg octavia-api octavia-api --config-file "$S/octavia/octavia.conf"
wait_tcp "$RABBIT_PORT" rabbitmq
el "rabbitmq up"
bg octavia-worker octavia-worker --config-file "$S/octavia/octavia.conf"

wait $KS_SETUP || fail "keystone db_sync/bootstrap failed (log/keystone-setup.log)"
# The catalog goes in before Keystone starts (creating services through
# keystone-wsgi-public on SQLite hits "database is locked"): internal = the
# real URL, public = a closed port, so a client on the wrong interface fails.
catalog() { # TYPE NAME INTERNAL_URL PUBLIC_URL
	local sid
	sid=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
	echo "INSERT INTO service (id, type, enabled, extra) VALUES ('$sid', '$1', 1, '{\"name\": \"$2\"}');"
	echo "INSERT INTO endpoint (id, interface, service_id, url, extra, enabled, region_id) VALUES ('$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')', 'internal', '$sid', '$3', '{}', 1, 'RegionOne');"
	echo "INSERT INTO endpoint (id, interface, service_id, url, extra, enabled, region_id) VALUES ('$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')', 'public', '$sid', '$4', '{}', 1, 'RegionOne');"
}
{
	catalog network neutron "$NEUTRON" "http://127.0.0.1:$DEAD_PORT"
	catalog compute nova "$NOVA" "http://127.0.0.1:$DEAD_PORT/v2.1"
	catalog load-balancer octavia "$OCTAVIA" "http://127.0.0.1:$DEAD_PORT"
} | sqlite3 "$S/keystone/keystone.db" || fail "keystone catalog insert failed"
bg keystone env OS_KEYSTONE_CONFIG_FILES="$S/keystone/keystone.conf" keystone-wsgi-public --host 127.0.0.1 --port "$KEYSTONE_PORT"
wait $NOVA_DB || fail "nova-manage failed (log/nova-manage.log)"
el "nova db ready"
bg nova-api nova-api "${NOVA_CONF[@]}"

wait_http "$KS/v3" keystone
TOKEN=$(curl -sf -D - -o /dev/null -H 'Content-Type: application/json' -X POST "$KS/v3/auth/tokens" -d '{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"admin","domain":{"id":"default"},"password":"'"$ADMIN_PASSWORD"'"}}},"scope":{"project":{"name":"admin","domain":{"id":"default"}}}}}' |
	awk 'tolower($1)=="x-subject-token:"{print $2}' | tr -d '\r')
[[ -n $TOKEN ]] || fail "keystone: admin token not issued"
el "keystone up (catalog: internal = real URLs, public = closed port)"
echo "LB_MGMT_NET=$MGMT" >>"$S/env"
wait_http "$OCTAVIA/" octavia-api
el "octavia-api up"
wait_http "$NOVA/" nova-api
el "nova-api up; testbed ready (endpoints in $S/env)"
