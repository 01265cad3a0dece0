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
# The rootfs tarball and the imported image are cached under CACHE_DIR (default ~/.cache/verl-env)
# keyed by suite, mirror and package list, so a second daemon (a test session) only pays for a
# `docker load`, and gets the same image ID.
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
# The imported image itself (`docker save`), loaded into every later engine: one image ID for
# the base in every engine (`docker import` makes a new one each time, and the content tag of
# every image built on it, which hashes the base's digest, would differ from engine to engine).
saved="$cache/debian-$suite-$key.image.tar"
mkdir -p "$cache"
# One debootstrap and one import per key: the groups of a test run start side by side and all
# need the same base; the others wait on the lock and load what the first one made.
exec 9>"$tarball.lock"
flock 9
# Re-importing would give a new image ID and invalidate every build cache on top of it.
have=$(docker image inspect -f '{{ index .Config.Labels "org.verl-env.debian-key" }}' "$tag" 2>/dev/null || true)
if [ "$have" = "$key" ]; then
  [ -s "$saved" ] || { docker save -o "$saved.part" "$tag" && mv "$saved.part" "$saved"; }
  echo "$tag"
  exit 0
fi
if [ -s "$saved" ]; then
  loaded=$(docker load -q -i "$saved" | sed -n 's/^Loaded image: //p' | tail -1)
  [ -n "$loaded" ] || { echo "debian-base.sh: docker load of $saved named no image" >&2; exit 1; }
  if [ "$loaded" != "$tag" ]; then
    docker tag "$loaded" "$tag"
    docker rmi "$loaded" >/dev/null  # the tag only: the image stays under $tag
  fi
  echo "$tag"
  exit 0
fi
if [ ! -s "$tarball" ]; then
  work=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --arch="$arch" --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" \
    >"$work/log" 2>&1 \
    || { tail -20 "$work/log" >&2; exit 1; }
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
  tar --numeric-owner -C "$work/root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$work"  # now: the import below sets a trap of its own
fi
if [ "$arch" = "$host_arch" ]; then
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' --change "LABEL org.verl-env.debian-key=$key" \
    "$tarball" "$tag" >/dev/null
else
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
docker save -o "$saved.part" "$tag"
mv "$saved.part" "$saved"
echo "$tag"
