#!/usr/bin/env bash
# deploy/cloudkitty/hashmap-example.sh — an example CloudKitty hashmap price
# table for tapflow's traffic (deploy/cloudkitty/metrics.yml): a price per GB
# (10^9 bytes) by zone, and by external network for zone "external".
#
#   CLOUDKITTY_URL=http://... OS_AUTH_URL=... OS_USERNAME=... OS_PASSWORD=... \
#   OS_PROJECT_NAME=admin deploy/cloudkitty/hashmap-example.sh
#   (or OS_TOKEN=<keystone token> instead of the OS_* password variables)
#
# Prices (a currency unit per GB), overridable:
#   ZONE_PRICES      "zone=price ..."          default "same_tenant=0.002 other_tenant=0.01 shared=0.01"
#   EXTERNAL_PRICES  "external_network=price ..." default "public=0.05 transit=0.08"
# external_network holds tapflow's label of the exit network (docs/attribution.md);
# zones without a mapping (external without a priced network, infra, multicast,
# miss) are rated 0. Each zone's traffic matches exactly one mapping: an
# external flow has external_network set and a zone with no mapping, every
# other flow has external_network "none".
#
# How CloudKitty's hashmap prices (cloudkitty/rating/hash): per service, the
# matching "flat" mappings of a group give the price per unit of quantity, so
# price = qty (bytes) x cost. The rated unit is the byte (metrics.yml), so the
# cost is the price per GB shifted by 9 decimal places, exact in decimal
# (bc), and sent as a string (a JSON number would reach CloudKitty as a float).
# A price per GiB would be price/1073741824: up to 30 decimals, more than
# the 28 the hashmap's Numeric(40, 28) cost column keeps. The two services of
# metrics.yml (billed_bytes: the bytes below 1e9; billed_bytes_e9: the
# whole 1e9s) get the same mappings.
#
# Idempotent: a service of the same name is deleted first (with its fields and
# mappings), so running it again applies the prices given now.
set -euo pipefail
: "${CLOUDKITTY_URL:?set CLOUDKITTY_URL (the rating endpoint)}"
ZONE_PRICES=${ZONE_PRICES:-"same_tenant=0.002 other_tenant=0.01 shared=0.01"}
EXTERNAL_PRICES=${EXTERNAL_PRICES:-"public=0.05 transit=0.08"}
SERVICES=(billed_bytes billed_bytes_e9)

if [[ -z ${OS_TOKEN:-} ]]; then
	: "${OS_AUTH_URL:?set OS_AUTH_URL or OS_TOKEN}" "${OS_USERNAME:?}" "${OS_PASSWORD:?}" "${OS_PROJECT_NAME:?}"
	body=$(jq -n --arg u "$OS_USERNAME" --arg p "$OS_PASSWORD" --arg pr "$OS_PROJECT_NAME" \
		--arg ud "${OS_USER_DOMAIN_ID:-default}" --arg pd "${OS_PROJECT_DOMAIN_ID:-default}" \
		'{auth:{identity:{methods:["password"],password:{user:{name:$u,domain:{id:$ud},password:$p}}},scope:{project:{name:$pr,domain:{id:$pd}}}}}')
	OS_TOKEN=$(curl -sf -D - -o /dev/null -H 'Content-Type: application/json' -X POST "${OS_AUTH_URL%/}/auth/tokens" -d @- <<<"$body" |
		awk 'tolower($1)=="x-subject-token:"{print $2}' | tr -d '\r')
	[[ -n $OS_TOKEN ]] || { echo "$0: keystone did not issue a token" >&2; exit 1; }
fi
api() { # METHOD PATH [BODY]; a 5xx (e.g. a database busy) is retried: nothing was written
	local out code
	for _ in 1 2 3 4 5; do
		out=$(curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' -H "X-Auth-Token: $OS_TOKEN" -X "$1" \
			"${CLOUDKITTY_URL%/}/v1/rating$2" ${3:+-d "$3"}) || out=$'\n000'
		code=${out##*$'\n'}
		case $code in
		2?? | 3??) printf '%s' "${out%$'\n'*}"; return 0 ;;
		5?? | 000) sleep 1 ;;
		*) break ;;
		esac
	done
	echo "$0: $1 $2: HTTP $code: ${out%$'\n'*} (is the token's user admin?)" >&2
	exit 1
}
per_byte() { # PRICE_PER_GB -> cost per byte, exact
	[[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "$0: price \"$1\" is not a decimal number" >&2; exit 1; }
	echo "scale=40; $1 / 1000000000" | bc | sed 's/^\./0./; s/0*$//; s/\.$//'
}

api PUT /modules/hashmap '{"module_id": "hashmap", "enabled": true}' >/dev/null
for svc in "${SERVICES[@]}"; do
	old=$(api GET /module_config/hashmap/services | jq -r --arg n "$svc" '.services[] | select(.name == $n) | .service_id')
	for id in $old; do
		api DELETE "/module_config/hashmap/services/$id" >/dev/null
	done
	sid=$(api POST /module_config/hashmap/services "{\"name\": \"$svc\"}" | jq -r .service_id)
	for field in zone external_network; do
		fid=$(api POST /module_config/hashmap/fields "{\"service_id\": \"$sid\", \"name\": \"$field\"}" | jq -r .field_id)
		prices=$ZONE_PRICES
		[[ $field == external_network ]] && prices=$EXTERNAL_PRICES
		for kv in $prices; do
			cost=$(per_byte "${kv#*=}")
			api POST /module_config/hashmap/mappings \
				"{\"field_id\": \"$fid\", \"value\": \"${kv%%=*}\", \"type\": \"flat\", \"cost\": \"$cost\"}" >/dev/null
			echo "hashmap: $svc $field=${kv%%=*}: ${kv#*=} per GB = $cost per byte"
		done
	done
done
