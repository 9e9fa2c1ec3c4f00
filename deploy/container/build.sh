#!/usr/bin/env bash
# deploy/container/build.sh — build the tapflow container image (make image).
#
# The image is FROM scratch (deploy/container/Containerfile): the static
# tapflow binary, Debian's CA bundle (package ca-certificates), an
# /etc/passwd and /etc/group naming root and tapflow (65532), the example
# config, /tmp and /var/lib/tapflow. This script assembles that tree as
# rootfs.tar with exact owners and modes and hands it to `podman build`
# (or `buildah bud`): nothing is pulled, nothing runs inside the build,
# no network is needed. As root it installs what is missing (Debian
# packages podman, ca-certificates); otherwise it names them and fails.
#
# Environment: IMAGE (tag, required), TAPFLOW_BIN (the static binary,
# required), VERSION, REVISION (labels), SOURCE_DATE_EPOCH (file and image
# timestamps; default: the last commit's time, so a rebuild of the same
# commit gives the same image ID), IMAGE_ARCHIVE (optional: also write
# the image there as an OCI archive, for `podman load` / `skopeo copy`).
set -euo pipefail

: "${IMAGE:?IMAGE (the tag to build, e.g. localhost/tapflow:dev) is not set}"
: "${TAPFLOW_BIN:?TAPFLOW_BIN (a static tapflow binary) is not set}"
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
certs=/etc/ssl/certs/ca-certificates.crt

need=()
command -v podman >/dev/null || command -v buildah >/dev/null || need+=(podman)
[[ -s $certs ]] || need+=(ca-certificates)
if ((${#need[@]} > 0)); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "image: missing Debian packages: ${need[*]}; as root: apt-get install ${need[*]} (or run make image as root)" >&2
		exit 1
	fi
	echo "image: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if command -v podman >/dev/null; then
	build=(podman build)
else
	build=(buildah bud)
fi
if [[ ! -x $TAPFLOW_BIN ]]; then
	echo "image: $TAPFLOW_BIN is not an executable (make image builds it)" >&2
	exit 1
fi

epoch=${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
r=$ctx/root
mkdir -p "$r/usr/bin" "$r/etc/ssl/certs" "$r/etc/tapflow" "$r/tmp" "$r/var/lib/tapflow"
install -m 0755 "$TAPFLOW_BIN" "$r/usr/bin/tapflow"
install -m 0644 "$certs" "$r/etc/ssl/certs/ca-certificates.crt"
install -m 0644 "$top/deploy/examples/tapflow.yaml" "$r/etc/tapflow/tapflow.yaml"
# The shell is a path that does not exist: nobody logs in.
printf 'root:x:0:0:root:/root:/sbin/nologin\ntapflow:x:65532:65532:tapflow:/var/lib/tapflow:/sbin/nologin\n' >"$r/etc/passwd"
printf 'root:x:0:\ntapflow:x:65532:\n' >"$r/etc/group"
chmod 0644 "$r/etc/passwd" "$r/etc/group"
chmod 0755 "$r" "$r/usr" "$r/usr/bin" "$r/etc" "$r/etc/ssl" "$r/etc/ssl/certs" "$r/etc/tapflow" "$r/var" "$r/var/lib"
chmod 1777 "$r/tmp"
chmod 0750 "$r/var/lib/tapflow"
# Owners are set in the archive, not on disk: no root needed for this.
tarx=(tar --sort=name --mtime="@$epoch" --numeric-owner --format=posix --pax-option=delete=atime,delete=ctime -C "$r")
"${tarx[@]}" --owner=0 --group=0 --exclude=./var/lib/tapflow -cf "$ctx/rootfs.tar" .
"${tarx[@]}" --owner=65532 --group=65532 -rf "$ctx/rootfs.tar" ./var/lib/tapflow

"${build[@]}" --quiet --file "$here/Containerfile" --tag "$IMAGE" --timestamp "$epoch" \
	--label org.opencontainers.image.title=tapflow \
	--label org.opencontainers.image.description="tapflow agent and collector (docs/containers.md)" \
	--label org.opencontainers.image.version="${VERSION:-dev}" \
	--label org.opencontainers.image.revision="${REVISION:-}" \
	"$ctx" >/dev/null
if command -v podman >/dev/null; then
	size="$(($(podman image inspect --format '{{.Size}}' "$IMAGE") / 1000000)) MB"
else
	size=$(buildah images --noheading --format '{{.Size}}' "$IMAGE")
fi
echo "image: built $IMAGE ($size)"
if [[ -n ${IMAGE_ARCHIVE:-} ]]; then
	mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
	rm -f "$IMAGE_ARCHIVE"
	if command -v podman >/dev/null; then
		podman save --quiet --format oci-archive -o "$IMAGE_ARCHIVE" "$IMAGE"
	else
		buildah push --quiet "$IMAGE" "oci-archive:$IMAGE_ARCHIVE:$IMAGE"
	fi
	echo "image: saved $IMAGE as $IMAGE_ARCHIVE (OCI archive; podman load -i / skopeo copy oci-archive:…)"
fi
