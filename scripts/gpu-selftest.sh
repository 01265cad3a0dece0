#!/usr/bin/env bash
# Run the self-test's GPU phases on a GPU host that has no container engine, against the host's
# own torch: the part of the gate this project's build machine cannot run (it has no GPU).
#
#   scripts/gpu-selftest.sh OUT_DIR
#
# The self-test package is copied out of the checkout as `verl_env_selftest` (as images carry
# it), with a manifest naming the host's torch as the pinned one (accelerator cuda or rocm, from
# torch itself). Four runs, each writing OUT_DIR/<name>.json and its exit code:
#   gpus-N      --expect-gpus N, N = the GPUs nvidia-smi/rocm-smi lists  (must pass: exit 0)
#   torchrun-N  the collective under torchrun, one rank per GPU          (must pass: exit 0)
#   gpus-N+1    one GPU more than the host has                          (must fail: exit 1)
#   hidden      CUDA_VISIBLE_DEVICES="" with --expect-gpus N             (must fail: exit 1)
# The script exits non-zero when any run's exit code is not the one required.
set -uo pipefail
out=${1:?usage: gpu-selftest.sh OUT_DIR}
mkdir -p "$out"
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$repo/builder/selftest" "$work/verl_env_selftest"
"$py" - "$work/manifest.json" <<'PY'
import json, platform, sys
import torch
acc = "rocm" if getattr(torch.version, "hip", None) else "cuda"
version = torch.__version__.split("+")[0]
json.dump({"schema": "verl-env/manifest/v1", "target": f"host-{acc}", "accelerator": acc,
           "arch": platform.machine(), "python": ".".join(platform.python_version_tuple()[:2]),
           "cuda": torch.version.cuda, "rocm": getattr(torch.version, "hip", None),
           "pins": {"torch": version}, "provided": {}, "imports": {"torch": "torch"},
           "source_builds": []}, open(sys.argv[1], "w"), indent=2)
PY
n=$("$py" -c 'import torch; print(torch.cuda.device_count())')
export PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}"
st=(-m verl_env_selftest --manifest "$work/manifest.json")
phases=preflight,env,imports,versions,gpu,collective
status=0
check() {  # name, wanted exit code, command...
  local name=$1 want=$2; shift 2
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc (wanted $want)" | tee -a "$out/summary.txt"
  [ "$rc" -eq "$want" ] || status=1
}
: > "$out/summary.txt"
nvidia-smi -L >> "$out/summary.txt" 2>&1 || rocm-smi >> "$out/summary.txt" 2>&1 || true
check "gpus-$n" 0 "$py" "${st[@]}" --phases "$phases" --expect-gpus "$n" --json "$out/gpus-$n.json"
check "torchrun-$n" 0 "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" \
  "${st[@]}" --expect-gpus "$n" --json "$out/torchrun-$n.json"
check "gpus-$((n + 1))" 1 "$py" "${st[@]}" --phases "$phases" --expect-gpus "$((n + 1))" \
  --json "$out/gpus-$((n + 1)).json"
check hidden 1 env CUDA_VISIBLE_DEVICES= HIP_VISIBLE_DEVICES= "$py" "${st[@]}" --phases "$phases" \
  --expect-gpus "$n" --json "$out/hidden.json"
exit "$status"
