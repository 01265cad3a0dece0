#!/usr/bin/env bash
# Build a minimal Debian root filesystem with debootstrap from this machine's own apt sources and
# import it into a Docker Engine as a base image. Nothing is pulled from a public image registry.
#
#   scripts/debian-base.sh TAG [CACHE_DIR]
#
# DEBIAN_ARCH=arm64 makes a foreign-architecture base (debootstrap runs the second stage under
# QEMU user emulation: qemu-user-static + binfmt-support) and imports it through a BuildKit
# `FROM scratch` + `ADD rootfs.tar /` build with --platform, since `docker import --platform`
# does not set the architecture on Engine 20.10.
#
# The rootfs tarball is cached under CACHE_DIR (default ~/.cache/verl-env) keyed by suite, mirror and
# package list, so a second daemon (a test session) only pays for `docker import`.
# DOCKER_HOST selects the engine. The mirror is read from /etc/apt (deb822 .sources or sources.list).
set -euo pipefail
tag=${1:?usage: debian-base.sh TAG [CACHE_DIR]}
cache=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/verl-env}
suite=${DEBIAN_SUITE:-bookworm}
include=${DEBIAN_INCLUDE:-python3,python3-venv,ca-certificates}
host_arch=$(dpkg --print-architecture)
arch=${DEBIAN_ARCH:-$host_arch}

mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
fi
[ -n "$mirror" ] || { echo "debian-base.sh: no Debian mirror found in /etc/apt" >&2; exit 2; }

if [ "$arch" = "$host_arch" ]; then
  key=$(printf '%s\n' "$suite" "$mirror" "$include" | sha256sum | cut -c1-16)
else
  key=$(printf '%s\n' "$suite" "$mirror" "$include" "$arch" | sha256sum | cut -c1-16)
  [ -e "/proc/sys/fs/binfmt_misc/qemu-${arch/arm64/aarch64}" ] || {
    echo "debian-base.sh: no QEMU binfmt handler for $arch: apt-get install qemu-user-static" \
         "binfmt-support (and mount binfmt_misc)" >&2; exit 2; }
fi
tarball="$cache/debian-$suite-$key.tar"
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  work=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --arch="$arch" --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" \
    >"$work/log" 2>&1 \
    || { tail -20 "$work/log" >&2; exit 1; }
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
  tar --numeric-owner -C "$work/root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi
# Re-importing would give a new image ID and invalidate every build cache on top of it.
have=$(docker image inspect -f '{{ index .Config.Labels "org.verl-env.debian-key" }}' "$tag" 2>/dev/null || true)
if [ "$have" != "$key" ] && [ "$arch" = "$host_arch" ]; then
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' --change "LABEL org.verl-env.debian-key=$key" \
    "$tarball" "$tag" >/dev/null
elif [ "$have" != "$key" ]; then
  ctx=$(mktemp -d "$cache/import.XXXXXX")
  trap 'rm -rf "$ctx"' EXIT
  ln "$tarball" "$ctx/rootfs.tar" 2>/dev/null || cp "$tarball" "$ctx/rootfs.tar"
  printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["/bin/bash"]' \
    "LABEL org.verl-env.debian-key=$key" >"$ctx/Dockerfile"
  if docker buildx version >/dev/null 2>&1; then
    docker buildx build -q --load --platform "linux/$arch" -t "$tag" "$ctx" >/dev/null
  else  # Debian's docker CLI (docker.io) carries a BuildKit client of its own
    DOCKER_BUILDKIT=1 /usr/bin/docker build -q --platform "linux/$arch" -t "$tag" "$ctx" >/dev/null
  fi
fi
echo "$tag"
