#!/usr/bin/env bash
# The main job on a fresh machine of this kind (Debian 12, root, no GPU, no public image registry):
# install build-env from this checkout, make sure a Docker Engine answers, make a debootstrap base
# image, then build -> verify -> tag the CPU fixture target, a real verl environment (torch CPU,
# Ray, tensordict, verl 0.9.1). The verified image stays in the engine, tagged
# verl-env:cpu-x86_64. On a GPU build host with Docker: `pip install . && build-env --target
# cuda-x86_64`.
#
# If no engine answers, dockerd is started on the default socket (/var/run/docker.sock) with its
# default, persistent data root (/var/lib/docker), and left running so the image stays usable;
# its PID and the command to stop it are printed. Nothing else is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/os-packages.sh
python3 -m pip install -q --disable-pip-version-check .
build_env="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/build-env"
if ! docker info >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ]; then
    echo "quickstart: DOCKER_HOST=$DOCKER_HOST does not answer; unset it or start that engine" >&2
    exit 1
  fi
  log=/var/log/verl-env-dockerd.log
  setsid dockerd >"$log" 2>&1 < /dev/null &
  pid=$!
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.4; done
  docker info >/dev/null 2>&1 || { echo "quickstart: dockerd did not start; see $log" >&2; exit 1; }
  echo "quickstart: started dockerd (pid $pid) on /var/run/docker.sock, data root /var/lib/docker," \
       "log $log; it keeps running so the image stays usable. Stop it with: kill $pid" >&2
fi
scripts/debian-base.sh verl-env-test/debian:bookworm >/dev/null
"$build_env" --target cpu-x86_64 --matrix "$PWD/tests/fixtures/cpu.yaml" \
  --ca-bundle "${VERL_ENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$@"
docker run --rm verl-env:cpu-x86_64 python3 -c 'import verl; print("verl", verl.__version__)'
echo "quickstart: verl-env:cpu-x86_64 is verified and tagged; try:" \
     "docker run --rm verl-env:cpu-x86_64 python3 -c 'import verl'" >&2
