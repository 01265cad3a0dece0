#!/usr/bin/env bash
# Acceptance outside CI: the Megatron stack (docs/megatron.md) built FROM a locally bootstrapped
# Debian base: cuda-x86_64-megatron (the cuda-x86_64 stack plus verl's mcore extra: mbridge,
# megatron-core, TransformerEngine's core wheel and its torch extension), with python overridden
# to what that base has and flash-attn switched off (its sdist build needs hours). The
# TransformerEngine torch extension (`transformer-engine-torch`, an sdist only) IS built, in its
# source stage against the image's torch, for one GPU architecture (GPUS, default sm_90): the
# Debian base has no CUDA toolkit, so nvcc and the CUDA/cuDNN headers come from the index's
# nvidia wheels (the target's build_tools). The gate must import transformer_engine.pytorch,
# transformer_engine_torch and megatron.core; on a machine without a GPU the GPU checks are
# reported as skipped with the reason.
#
# The Debian base here has python 3.11, and megatron-core >= 0.17 needs python >= 3.12 (the target's
# Ubuntu 24.04 base has 3.12): the run moves megatron-core to MEGATRON_CORE (default 0.16.0, the
# newest that takes 3.11), with that release's metadata added to a copy of the snapshot.
#
#   scripts/acceptance-megatron.sh [OUT_JSON]      (DOCKER_HOST selects the engine)
#
# Writes the build report to build/acceptance-megatron/report.json and a summary (build time,
# the TransformerEngine stage's time, image size, verdict) to OUT_JSON (default
# docs/acceptance-megatron.json).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/acceptance-megatron.json}
[ $# -gt 0 ] && shift  # the rest goes to build-env
gpus=${GPUS:-sm_90}
work=build/acceptance-megatron
base=verl-env-test/debian:bookworm
mcore=${MEGATRON_CORE:-0.16.0}
scripts/debian-base.sh "$base" >/dev/null
mkdir -p "$work"
python3 - "$work/snapshot.json" "$mcore" <<'PY'
import sys
from pathlib import Path
from builder.resolve.metadata import IndexClient, load_snapshot, refresh, save_snapshot
snapshot = load_snapshot(Path("metadata/pypi-snapshot.json"))
save_snapshot(refresh(snapshot, [("megatron-core", sys.argv[2])], IndexClient()), Path(sys.argv[1]))
PY
start=$(date +%s)
set +e
build-env --target cuda-x86_64-megatron --base-image "$base" --set python=3.11 \
  --set gpus="$gpus" --set packages.flash-attn.enabled=false \
  --set packages.megatron-core="$mcore" --snapshot "$work/snapshot.json" \
  --tag-prefix verl-env-acceptance \
  --ca-bundle "${VERL_ENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" \
  --workdir "$work" "$@"
status=$?
set -e
end=$(date +%s)
scripts/acceptance-summary.py "$out" "$status" "$((end - start))" "$work/report.json" \
  --stage-seconds transformer_engine_torch_build_seconds=source-transformer-engine-torch \
  --field gpus="[\"${gpus//,/\",\"}\"]" --pin moved_for_python_3_11=megatron-core
exit "$status"
