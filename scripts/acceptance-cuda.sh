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
python3 - "$out" "$status" "$((end - start))" <<'PY'
import json, sys, docker
out, status, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
report = json.load(open("build/acceptance/report.json"))
size = None
if report.get("image_id"):
    try:
        size = docker.from_env().images.get(report["image_id"]).attrs["Size"]
    except docker.errors.ImageNotFound:
        pass
checks = (report.get("verification") or {}).get("checks", [])
summary = {
    "target": report["target"], "exit_code": status, "result": report["result"],
    "wall_seconds": seconds, "stages": report["stages"], "image_size_bytes": size,
    "tags": report["tags"], "pins": report["pins"],
    "checks": {c["id"]: {"status": c["status"], "reason": c.get("reason")} for c in checks},
}
json.dump(summary, open(out, "w"), indent=2, sort_keys=True)
print(json.dumps({k: summary[k] for k in ("result", "wall_seconds", "image_size_bytes")}))
PY
exit "$status"
