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
python3 - "$out" "$status" "$((end - start))" "$work/report.json" <<'PY'
import json, sys, docker
out, status, seconds, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
report = json.load(open(path))
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
