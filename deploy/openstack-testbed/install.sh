#!/usr/bin/env bash
# deploy/openstack-testbed/install.sh [--check] — install the Debian packages
# the OpenStack testbed runs: the real Keystone (22, Zed), Neutron (21), Nova
# API (26) and Octavia API + worker (11) servers, RabbitMQ (only Octavia's
# api -> worker cast needs a real bus), CloudKitty 17 with Prometheus 2.42 and
# InfluxDB 1.6 for cloudkitty-up.sh (billing, docs/billing.md), and the tools
# up.sh uses.
#
# Idempotent and fast: a no-op (milliseconds) when everything is present.
# --check only reports: exit 0 when installed, 1 (with the missing package
# names) when not. Installing needs root.
set -euo pipefail

# package -> a file up.sh runs from it
declare -A probe=(
	[python3-keystone]=/usr/bin/keystone-wsgi-public
	[neutron-server]=/usr/bin/neutron-server
	[nova-api]=/usr/bin/nova-api
	[octavia-api]=/usr/bin/octavia-api
	[python3-octavia]=/usr/bin/octavia-worker
	[rabbitmq-server]=/usr/lib/rabbitmq/bin/rabbitmq-server
	[python3-cloudkitty]=/usr/bin/cloudkitty-processor
	[cloudkitty-api]=/etc/init.d/cloudkitty-api
	[cloudkitty-processor]=/etc/init.d/cloudkitty-processor
	[prometheus]=/usr/bin/prometheus
	[influxdb]=/usr/bin/influxd
	[jq]=/usr/bin/jq
	[sqlite3]=/usr/bin/sqlite3
	[openssl]=/usr/bin/openssl
	[curl]=/usr/bin/curl
	[bc]=/usr/bin/bc
)
need=()
for p in "${!probe[@]}"; do
	[[ -x ${probe[$p]} ]] || need+=("$p")
done
if ((${#need[@]} == 0)); then
	exit 0
fi
if [[ ${1:-} == --check ]]; then
	echo "openstack-testbed: missing Debian packages: ${need[*]}; run deploy/openstack-testbed/install.sh as root" >&2
	exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "openstack-testbed: missing Debian packages: ${need[*]}; run deploy/openstack-testbed/install.sh as root" >&2
	exit 1
fi

# Debian's postinst scripts would start neutron, nova and rabbitmq as system
# services with their default configs; a policy-rc.d that exits 101 forbids it.
if [[ ! -x /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\n# tapflow openstack-testbed: never start services from maintainer scripts\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 0755 /usr/sbin/policy-rc.d
fi

echo "openstack-testbed: installing ${need[*]} (about 2 minutes on a fresh machine)" >&2
t0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "openstack-testbed: installed in $(($(date +%s) - t0))s" >&2
