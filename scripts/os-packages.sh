#!/usr/bin/env bash
# Install the OS packages the tests and the quick start use (Debian 12). Needs root.
# Real parts only: Docker Engine, an OCI registry, Slurm, siftool/mksquashfs, shellcheck,
# debootstrap for the base image, charliecloud (runs a SIF's squashfs), skopeo/umoci, gnupg (the
# tests check SIF signatures with the real gpg, independently of the PGPy code under test), and
# Go + sylabs sif sources (the tests build the reference SIF signature verifier from them), g++
# (nvcc's host compiler in the device-code tests), clang-tools-22 (LLVM's clang-offload-bundler,
# the reference reader of HIP offload bundles; 22 reads the v3 compressed bundles that ROCm 7
# writes, 19 does not), and what building enroot and pyxis from source needs (libslurm-dev:
# Slurm's spank.h).
set -euo pipefail
packages=(docker.io docker-registry apache2-utils slurmctld slurmd slurm-client munge shellcheck
          squashfuse squashfs-tools siftool skopeo umoci charliecloud-runtime debootstrap
          qemu-user-static binfmt-support gnupg openssl golang-go golang-github-sylabs-sif-dev
          g++ clang-tools-22
          # enroot and pyxis, built by tests/slurm from their source snapshots (../shared/vendor)
          gcc make libc6-dev libslurm-dev libcap2-bin curl gawk jq parallel pigz zstd
          fuse-overlayfs fuse3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "os-packages.sh: need root to install: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
