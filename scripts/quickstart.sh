#!/usr/bin/env bash
# The main job on a fresh machine of this kind (Debian 12, root, no GPU, no public image registry):
# install, start a Docker Engine if none answers, make a debootstrap base image, then
# build -> verify -> tag the CPU fixture target, a real verl environment (torch CPU, Ray,
# tensordict, verl 0.9.1). On a GPU build host with Docker, run `build-env --target cuda-x86_64`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/os-packages.sh
python3 -m pip install -q --disable-pip-version-check .
if ! docker info >/dev/null 2>&1; then
  root=$(mktemp -d /var/tmp/verl-env-dockerd.XXXXXX)
  dockerd --data-root "$root/data" --exec-root "$root/exec" --pidfile "$root/pid" \
    -H "unix://$root/sock" --bridge=none --iptables=false --ip6tables=false \
    >"$root/log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$root"' EXIT
  export DOCKER_HOST="unix://$root/sock"
  for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; sleep 0.3; done
fi
scripts/debian-base.sh verl-env-test/debian:bookworm >/dev/null
build-env --target cpu-x86_64 --matrix tests/fixtures/cpu.yaml \
  --ca-bundle "${VERL_ENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$@"
