#!/usr/bin/env bash
# The merged gate on a kept Megatron acceptance image, without rebuilding it (docs/megatron.md,
# "The merged gate"): derive an image with the cuBLAS the Megatron locks pin (the hashed wheel,
# --no-deps), then run this checkout's self-test (all phases) and an RTLD_NOW dlopen of TE's
# core library on the original and the derived image.
# usage: DOCKER_HOST=... scripts/megatron-merged-gate.sh IMAGE WHEEL OUTDIR
set -euo pipefail
image=$1 wheel=$2 out=$3
repo=$(cd "$(dirname "$0")/.." && pwd)
derived="${image%-candidate}-cublas"
sha=$(sha256sum "$wheel" | cut -c1-64)
name=$(basename "$wheel")
grep -q "sha256:$sha" "$repo/locks/cuda-x86_64-megatron.txt" || {
    echo "error: $name: sha256 $sha is not in locks/cuda-x86_64-megatron.txt" >&2; exit 2; }
mkdir -p "$out/w"
cp "$wheel" "$out/w/"
version=${name#nvidia_cublas-}
echo "nvidia-cublas==${version%%-py3*} --hash=sha256:$sha" > "$out/w/req.txt"
docker run --name megatron-derive --network none -v "$out/w:/w:ro" \
    --entrypoint /opt/venv/bin/python \
    "$image" -m pip install --no-deps --no-index --require-hashes --find-links /w -r /w/req.txt
docker commit megatron-derive "$derived" >/dev/null
docker rm megatron-derive >/dev/null
# the image's manifest, with the current matrix's abi_allow and overrides of the target
docker run --rm --network none --entrypoint cat "$image" /opt/verl-env/manifest.json \
    > "$out/image-manifest.json"
python3 - "$repo/matrix.yaml" "$out/image-manifest.json" "$out/manifest.json" <<'PY'
import json, sys, yaml
m = json.load(open(sys.argv[2]))
t = yaml.safe_load(open(sys.argv[1]))["targets"][m["target"]]
m["abi_allow"] = dict(t.get("abi_allow") or {})
m["overrides"] = dict(t.get("overrides") or {})
json.dump(m, open(sys.argv[3], "w"), indent=1, sort_keys=True)
PY
chmod -R a+rwX "$out"
for img in "$image" "$derived"; do
    tag=${img##*:}
    docker run --rm --network none -v "$repo/builder/selftest:/opt/verl-env/verl_env_selftest:ro" \
        -v "$out:/r" --entrypoint /opt/venv/bin/python "$img" -c \
        "import sys; sys.path.insert(0, '/opt/verl-env'); from verl_env_selftest.cli import main
sys.exit(main())" \
        --manifest /r/manifest.json --json "/r/report-$tag.json" > "$out/selftest-$tag.txt" 2>&1 \
        && echo "$tag: self-test pass" || echo "$tag: self-test rc=$?"
    docker run --rm --network none -v "$repo/scripts:/x:ro" --entrypoint /opt/venv/bin/python \
        "$img" /x/te-core-dlopen.py || true
done
