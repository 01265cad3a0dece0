#!/usr/bin/env bash
# Acceptance outside CI: the real cuda-x86_64 stack (torch 2.11.0 CUDA 13.0 wheels, vLLM 0.24.0,
# transformers 5.9.0, Ray 2.60.0, tensordict 0.10.0, verl 0.9.1) built FROM a locally bootstrapped
# Debian base, with python overridden to what that base has and flash-attn switched off (its
# sdist build needs nvcc and hours). It must pass the gate with `import verl` and `import vllm`;
# on a machine without a GPU the GPU checks are reported as skipped with the reason.
#
#   scripts/acceptance-cuda.sh [OUT_JSON]      (DOCKER_HOST selects the engine)
#
# Writes the build report to build/acceptance/report.json and a summary (build time, image size,
# verification verdict) to OUT_JSON (default docs/acceptance-cuda.json).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/acceptance-cuda.json}
[ $# -gt 0 ] && shift  # the rest goes to build-env
base=verl-env-test/debian:bookworm
scripts/debian-base.sh "$base" >/dev/null
start=$(date +%s)
set +e
build-env --target cuda-x86_64 --base-image "$base" --set python=3.11 \
  --set packages.flash-attn.enabled=false --tag-prefix verl-env-acceptance \
  --ca-bundle "${VERL_ENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" \
  --workdir build/acceptance "$@"
status=$?
set -e
end=$(date +%s)
scripts/acceptance-summary.py "$out" "$status" "$((end - start))" build/acceptance/report.json
exit "$status"
