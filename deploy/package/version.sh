#!/bin/sh
# deploy/package/version.sh — the Debian version of this checkout, from
# `git describe`: v1.2.3 → 1.2.3; v1.2.3-4-gabcdef0 → 1.2.3+4.gabcdef0;
# no tag → 0.0.0+<commits>.g<hash> (grows with history, so dpkg upgrades
# in order); a dirty tree adds ~dirty (sorts before the clean build).
set -eu
d=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || true)
if [ -z "$d" ]; then
	d="v0.0.0-$(git rev-list --count HEAD 2>/dev/null || echo 0)-g$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
	git diff --quiet HEAD 2>/dev/null || d="$d-dirty"
fi
v=${d#v}
dirty=
case "$v" in *-dirty) v=${v%-dirty}; dirty="~dirty" ;; esac
# 1.2.3-4-gabc → 1.2.3+4.gabc; a pre-release tag 1.2.3-rc1 → 1.2.3~rc1
case "$v" in
*-*-g*) base=${v%-*-g*}; rest=${v#"$base"-}; v="$(echo "$base" | tr - '~')+$(echo "$rest" | tr - .)" ;;
*-*) v=$(echo "$v" | tr - '~') ;;
esac
echo "$v$dirty"
