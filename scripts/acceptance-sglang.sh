#!/usr/bin/env bash
# Acceptance outside CI: the real cuda-x86_64-sglang stack (verl 0.9.1's `sglang` extra: torch
# 2.11.0 CUDA 13.0 wheels, sglang 0.5.12 with sglang-kernel and flashinfer from the index,
# transformers 5.9.0 forced over sglang's own pin by the matrix's reviewed override, Ray 2.60.0,
# tensordict 0.10.0) built FROM a locally bootstrapped Debian base, with python overridden to
# what that base has. The target carries no flash-attn 2 (matrix.yaml says why), so nothing is
# switched off. It must pass the gate with `import sglang` and `import sgl_kernel`; on a machine
# without a GPU the GPU checks are reported as skipped with the reason.
#
#   scripts/acceptance-sglang.sh [OUT_JSON] [BUILD-ENV ARGS...]   (DOCKER_HOST selects the engine)
#
# Writes the build report to build/acceptance-sglang/report.json and a summary (build time,
# image size, the verdict of every check) to OUT_JSON (default docs/acceptance-sglang.json).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/acceptance-sglang.json}
[ $# -gt 0 ] && shift  # the rest goes to build-env
work=build/acceptance-sglang
base=verl-env-test/debian:bookworm
scripts/debian-base.sh "$base" >/dev/null
start=$(date +%s)
set +e
build-env --target cuda-x86_64-sglang --base-image "$base" --set python=3.11 \
  --tag-prefix verl-env-acceptance \
  --ca-bundle "${VERL_ENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" \
  --workdir "$work" "$@"
status=$?
set -e
end=$(date +%s)
scripts/acceptance-summary.py "$out" "$status" "$((end - start))" "$work/report.json"
exit "$status"
