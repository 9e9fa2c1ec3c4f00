#!/usr/bin/env bash
# deploy/openstack-testbed/seed.sh STATE_DIR — a small topology for manual
# use and demos (the contract tests build their own): external network
# public 203.0.113.0/24, P's tenant network 10.0.0.0/24, a router with
# gateway and interface, vm1 (floating IP 203.0.113.50) and vm2 (allowed-
# address pairs, one with its own MAC), Nova servers for both, and an
# ACTIVE_STANDBY amphora load balancer on the tenant subnet. Prints the ids.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 STATE_DIR" >&2; exit 2; }
S=$(realpath -m "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC1091
set -a && . "$S/env" && set +a
P=${PROJECT:-11111111111111111111111111111111}
N=$NEUTRON_URL/v2.0
H=(-H 'Content-Type: application/json' -H 'X-Auth-Token: testbed')
post() { curl -sf "${H[@]}" -X POST "$N/$1" -d "$2"; }

EXTNET=$(post networks '{"network":{"name":"public","router:external":true,"provider:network_type":"flat","provider:physical_network":"public","project_id":"admin"}}' | jq -r .network.id)
post subnets '{"subnet":{"name":"public-sub","network_id":"'"$EXTNET"'","ip_version":4,"cidr":"203.0.113.0/24","gateway_ip":"203.0.113.1","enable_dhcp":false,"project_id":"admin"}}' >/dev/null
NET=$(post networks '{"network":{"name":"tenant-net","project_id":"'$P'"}}' | jq -r .network.id)
SUB=$(post subnets '{"subnet":{"name":"tenant-sub","network_id":"'"$NET"'","ip_version":4,"cidr":"10.0.0.0/24","project_id":"'$P'"}}' | jq -r .subnet.id)
RTR=$(post routers '{"router":{"name":"r1","project_id":"'$P'","external_gateway_info":{"network_id":"'"$EXTNET"'"}}}' | jq -r .router.id)
curl -sf "${H[@]}" -X PUT "$N/routers/$RTR/add_router_interface" -d '{"subnet_id":"'"$SUB"'"}' >/dev/null
S1=aaaaaaaa-0000-0000-0000-000000000001 S2=aaaaaaaa-0000-0000-0000-000000000002
VM1=$(post ports '{"port":{"name":"vm1","network_id":"'"$NET"'","project_id":"'$P'","mac_address":"fa:16:3e:00:00:01","device_owner":"compute:nova","device_id":"'$S1'","fixed_ips":[{"subnet_id":"'"$SUB"'","ip_address":"10.0.0.11"}]}}' | jq -r .port.id)
VM2=$(post ports '{"port":{"name":"vm2","network_id":"'"$NET"'","project_id":"'$P'","mac_address":"fa:16:3e:00:00:02","device_owner":"compute:nova","device_id":"'$S2'","fixed_ips":[{"ip_address":"10.0.0.12"}],"allowed_address_pairs":[{"ip_address":"10.0.0.200/32"},{"ip_address":"10.0.0.201","mac_address":"fa:16:3e:00:00:99"}]}}' | jq -r .port.id)
post floatingips '{"floatingip":{"floating_network_id":"'"$EXTNET"'","project_id":"'$P'","port_id":"'"$VM1"'","floating_ip_address":"203.0.113.50"}}' >/dev/null
/usr/bin/python3 "$HERE/lib/nova_servers.py" "$NOVA_CONF" \
	"$S1,vm1,$P,$VM1,fa:16:3e:00:00:01,10.0.0.11,203.0.113.50" "$S2,vm2,$P,$VM2,fa:16:3e:00:00:02,10.0.0.12" >/dev/null 2>&1
LB=$(curl -sf -H 'Content-Type: application/json' -H "X-Project-Id: $P" -H 'X-Auth-Token: testbed' \
	-X POST "$OCTAVIA_URL/v2/lbaas/loadbalancers" -d '{"loadbalancer":{"name":"lb1","vip_subnet_id":"'"$SUB"'","provider":"amphora"}}' | jq -r .loadbalancer.id)
st=
for _ in $(seq 1 240); do
	st=$(curl -sf "$OCTAVIA_URL/v2/lbaas/loadbalancers/$LB" | jq -r .loadbalancer.provisioning_status)
	[[ $st == ACTIVE ]] && break
	[[ $st == ERROR ]] && { echo "seed: load balancer $LB went to ERROR (log/octavia-worker.log)" >&2; exit 1; }
	sleep 0.5
done
[[ $st == ACTIVE ]] || { echo "seed: load balancer $LB is $st after 120s" >&2; exit 1; }
echo "EXTNET=$EXTNET NET=$NET SUB=$SUB RTR=$RTR VM1=$VM1 VM2=$VM2 LB=$LB amphorae=$(curl -sf "$OCTAVIA_URL/v2/octavia/amphorae" | jq '.amphorae|length')"
