#!/usr/bin/env bash
# Build a minimal Debian root filesystem with debootstrap from this machine's own apt sources and
# import it into a Docker Engine as a base image. Nothing is pulled from a public image registry.
#
#   scripts/debian-base.sh TAG [CACHE_DIR]
#
# The rootfs tarball is cached under CACHE_DIR (default ~/.cache/verl-env) keyed by suite, mirror and
# package list, so a second daemon (a test session) only pays for `docker import`.
# DOCKER_HOST selects the engine. The mirror is read from /etc/apt (deb822 .sources or sources.list).
set -euo pipefail
tag=${1:?usage: debian-base.sh TAG [CACHE_DIR]}
cache=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/verl-env}
suite=${DEBIAN_SUITE:-bookworm}
include=${DEBIAN_INCLUDE:-python3,python3-venv,ca-certificates}

mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
fi
[ -n "$mirror" ] || { echo "debian-base.sh: no Debian mirror found in /etc/apt" >&2; exit 2; }

key=$(printf '%s\n' "$suite" "$mirror" "$include" | sha256sum | cut -c1-16)
tarball="$cache/debian-$suite-$key.tar"
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  work=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" >"$work/log" 2>&1 \
    || { tail -20 "$work/log" >&2; exit 1; }
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
  tar --numeric-owner -C "$work/root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi
# Re-importing would give a new image ID and invalidate every build cache on top of it.
have=$(docker image inspect -f '{{ index .Config.Labels "org.verl-env.debian-key" }}' "$tag" 2>/dev/null || true)
if [ "$have" != "$key" ]; then
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' --change "LABEL org.verl-env.debian-key=$key" \
    "$tarball" "$tag" >/dev/null
fi
echo "$tag"
