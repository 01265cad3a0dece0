#!/usr/bin/env bash
# Acceptance: tensordict 0.10.0 built from a local source tree into the arm64 CPU target, under
# QEMU user emulation on an x86_64 build host (what a firewalled GH200/GB200 site does: no git
# URL, no sdist from the index), then gated and tagged.
#
#   scripts/acceptance-tensordict.sh SRC_DIR [OUT_JSON]
#
# SRC_DIR: a copy of tensordict's public repository at tag v0.10.0 (a checkout or `git archive`;
# this project does not vendor it). The site (scripts/acceptance-tensordict/) is copied to a
# temporary directory with SRC_DIR filled in; its committed locks are reused as they are, never
# re-locked (a later re-lock can fail when a pinned release is no longer installable).
# Needs: root, a Docker Engine (DOCKER_HOST), debootstrap, qemu-user-static + binfmt-support, the
# package index reachable from containers (VERL_ENV_CA_BUNDLE or the host CA bundle is injected).
# BUILD_ENV selects the build-env executable. Prints the timings; OUT_JSON gets them as JSON.
set -euo pipefail
src=$(realpath "${1:?usage: acceptance-tensordict.sh SRC_DIR [OUT_JSON]}")
out=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
build_env=${BUILD_ENV:-build-env}
ca=${VERL_ENV_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
grep -qE '^name *= *"tensordict"' "$src/pyproject.toml" 2>/dev/null \
  || { echo "acceptance-tensordict.sh: $src is not a tensordict source tree" >&2; exit 2; }

site=$(mktemp -d /var/tmp/verl-env-tensordict.XXXXXX)
trap 'rm -rf "$site"' EXIT
cp -r "$here/acceptance-tensordict/locks" "$here/acceptance-tensordict/metadata" "$site/"
sed "s|@SRC@|$src|" "$here/acceptance-tensordict/matrix.yaml.in" >"$site/matrix.yaml"

t0=$(date +%s.%N)
DEBIAN_ARCH=arm64 "$here/debian-base.sh" verl-env-test/debian-arm64:bookworm >/dev/null
t1=$(date +%s.%N)
"$build_env" check --matrix "$site/matrix.yaml"   # offline: the committed lock is current
set +e
"$build_env" --target cpu-arm64-tensordict --matrix "$site/matrix.yaml" --ca-bundle "$ca" \
  --workdir "$site/work" --json >"$site/report.json"
rc=$?
set -e
t2=$(date +%s.%N)
python3 - "$site/report.json" "$t0" "$t1" "$t2" "$src" "$out" <<'PY'
import json, sys
report, t0, t1, t2, src, out = sys.argv[1], *map(float, sys.argv[2:5]), sys.argv[5], sys.argv[6]
r = json.load(open(report))
st = r.get("stages", {})
steps = st.get("build", {}).get("step_times") or st.get("build", {}).get("steps") or []
# the shared source-build stage and one source-NAME stage per package (its pip wheel step
# mounts the package's own cache, verl-env-src-NAME-...)
source = [s for s in steps if str(s.get("stage", "")).startswith("source-")]
compile_s = max((s["seconds"] for s in source if "verl-env-src-" in s.get("instruction", "")),
                default=None)
checks = {c["id"]: c for c in (r.get("verification") or {}).get("checks", [])}
summary = {
    "result": r.get("result"), "error": r.get("error"), "source": src,
    "image_id": r.get("image_id"), "tags": r.get("tags"),
    "arm64_base_s": round(t1 - t0, 1), "pipeline_s": round(t2 - t1, 1),
    "overall_s": round(t2 - t0, 1),
    "build_s": st.get("build", {}).get("seconds"),
    "source_stage_steps_s": round(sum(s.get("seconds", 0) for s in source), 1),
    "tensordict_compile_s": compile_s,
    "verify_s": st.get("verify", {}).get("seconds"),
    "emulated": ((r.get("verification") or {}).get("gate") or {}).get("arch", {}).get("emulated"),
    "checks": {k: checks[k]["status"] + ": " + (checks[k].get("reason") or "")
               for k in ("cpu.source_build.tensordict", "cpu.tensordict_membership",
                         "imports.tensordict", "versions.pin.tensordict", "ray.local_start")
               if k in checks},
}
text = json.dumps(summary, indent=2)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
exit $rc
