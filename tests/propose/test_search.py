"""`build-env propose`, offline: the newest coherent set and why each package stops, against a
recorded snapshot whose answer is known (tests/propose/data)."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from builder.resolve.metadata import load_snapshot
from builder.propose.proposal import Proposal, propose
from builder.propose.search import Anchors, ProposeError, Space, find_links_releases
from builder.matrix.spec import load_matrix
from tests.conftest import run_build_env

DATA = Path(__file__).parent / "data"


def fake_wheel(folder: Path, version: str, tag: str = "cp312-cp312-manylinux_2_28_x86_64") -> Path:
    """A find-links wheel of torch holding only its METADATA (what propose reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"torch-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
                    "Requires-Python: >=3.10\nRequires-Dist: filelock\n")
    return path


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """The data site copied, its find-links directory holding CPU and CUDA 12.8 torch wheels."""
    (tmp_path / "metadata").mkdir()
    (tmp_path / "metadata" / "pypi-snapshot.json").write_text(
        (DATA / "metadata" / "pypi-snapshot.json").read_text())
    wheels = tmp_path / "wheels"
    for v in ("2.13.0+cpu", "2.14.0+cpu", "2.15.0+cu128"):
        fake_wheel(wheels, v)
    text = (DATA / "matrix.yaml").read_text().replace("find_links: [wheels]",
                                                       f"find_links: [{wheels}]")
    (tmp_path / "matrix.yaml").write_text(text)
    return tmp_path / "matrix.yaml"


def _propose(matrix: Path, name: str, **anchors: list[str]) -> Proposal:
    m = load_matrix(matrix)
    snap = load_snapshot(matrix.parent / "metadata" / "pypi-snapshot.json")
    return propose(m.target(name), snap, Anchors.parse(**anchors))


def _pins(p: Proposal) -> dict[str, str]:
    return {pin.name: pin.new for pin in p.pins}


def _pin(p: Proposal, name: str):
    return next(pin for pin in p.pins if pin.name == name)


def test_newest_coherent_set(site: Path) -> None:
    p = _propose(site, "gpu")
    assert _pins(p) == {"verl": "0.9.1", "vllm": "0.31.0", "torch": "2.13.0",
                        "transformers": "5.10.4", "ray": "2.60.0", "tensordict": "0.10.0"}
    assert [pin.name for pin in p.pins if pin.moved] == ["vllm", "torch", "transformers"]
    assert _pin(p, "vllm").newest == "0.33.0"  # the pre-release 0.34.0rc1 is not a candidate
    assert _pin(p, "verl").reason is None  # at its newest: nothing to explain


def test_blocked_upgrade_names_both_packages_and_ranges(site: Path) -> None:
    vllm = _pin(_propose(site, "gpu"), "vllm")
    assert vllm.blocked == "0.32.0"
    assert vllm.reason == ("vllm 0.32.0 needs transformers>=5.16.1; verl 0.9.1 requires "
                           "transformers!=5.6.0,<5.11,>=5.5.3")
    assert vllm.unblock.startswith("a verl release that allows transformers>=5.16.1")
    assert "0.9.1 is the newest verl" in vllm.unblock
    torch = _pin(_propose(site, "gpu"), "torch")
    assert torch.reason == "vllm 0.31.0 requires torch==2.13.0"
    assert "vllm 0.32.0 allows it" in torch.unblock


def test_newest_release_without_a_wheel_for_the_platform_is_skipped(site: Path) -> None:
    ray = _pin(_propose(site, "gpu"), "ray")
    assert ray.new == "2.60.0" and ray.newest == "2.61.0"
    assert "ray 2.61.0 has no wheel for x86_64 python 3.12 on glibc 2.35" in ray.reason
    assert "manylinux_2_35_x86_64" in ray.reason and "base.glibc" in ray.unblock
    assert [s["version"] for s in ray.skipped] == ["2.61.0"]
    # the same target on a glibc 2.39 base takes it: the wheel check is what held it back
    m = load_matrix(site)
    t = m.target("gpu")
    newer = replace(t, base=replace(t.base, glibc="2.39"))
    snap = load_snapshot(site.parent / "metadata" / "pypi-snapshot.json")
    assert _pins(propose(newer, snap))["ray"] == "2.61.0"


def test_cuda_variant_torch(site: Path) -> None:
    m = load_matrix(site)
    snap = load_snapshot(site.parent / "metadata" / "pypi-snapshot.json")
    gpu = Space(m.target("gpu"), snap)
    # the index's torch 2.15.0 depends on cuda-toolkit 13.2: not the target's CUDA 13.0
    stop = gpu.unusable("torch", "2.15.0")
    assert stop is not None and stop.reason == ("torch 2.15.0 is a CUDA 13.2 build; targets.gpu"
                                                " needs a CUDA 13.0 build")
    assert "targets.gpu.cuda" in stop.unblock
    # a local +cu128 wheel in find-links is a CUDA 12.8 build: refused for CUDA 13.0 as well
    with_links = Space(m.target("gpu"), snap, local=find_links_releases(m.target("cpu")))
    cu128 = with_links.unusable("torch", "2.15.0+cu128")
    assert cu128 is not None and "CUDA 12.8 build" in cu128.reason
    assert gpu.unusable("torch", "2.14.0") is None
    # the CPU target takes the +cpu wheels of its find-links, never the index's CUDA builds
    cpu = _propose(site, "cpu")
    torch = _pin(cpu, "torch")
    assert torch.new == "2.14.0+cpu"
    assert torch.blocked == "2.15.0" and "is a CUDA 13.2 build; targets.cpu needs a CPU build" \
        in torch.reason
    assert {s["version"] for s in torch.skipped} >= {"2.15.0", "2.15.0+cu128"}
    # raising the target's CUDA to 13.2 makes 2.15.0 the build it needs (and 2.14.0 not)
    cuda132 = Space(replace(m.target("gpu"), cuda="13.2"), snap)
    assert cuda132.unusable("torch", "2.15.0") is None
    assert cuda132.unusable("torch", "2.14.0") is not None


def test_anchors(site: Path) -> None:
    held = _propose(site, "gpu", hold=["vllm"])
    assert _pins(held)["vllm"] == "0.24.0" and _pins(held)["torch"] == "2.11.0"
    assert _pin(held, "vllm").reason == "vllm is anchored at 0.24.0 (--hold vllm)"
    assert _pin(held, "torch").reason == "vllm 0.24.0 requires torch==2.11.0"
    assert _pins(held)["transformers"] == "5.10.4"
    only = _propose(site, "gpu", only=["transformers"])
    assert [pin.name for pin in only.pins if pin.moved] == ["transformers"]
    wanted = _propose(site, "gpu", want=["torch==2.11.0"])
    assert _pins(wanted)["vllm"] == "0.24.0"
    with pytest.raises(ProposeError, match="not an enabled pin of targets.gpu"):
        _propose(site, "gpu", hold=["numpy"])
    with pytest.raises(ProposeError, match="--want torch==2.15.0: torch 2.15.0 is a CUDA 13.2"):
        _propose(site, "gpu", want=["torch==2.15.0"])
    with pytest.raises(ProposeError, match="NAME==VERSION"):
        Anchors.parse(want=["torch>=2"])


def test_cli_json_and_text(site: Path) -> None:
    proc = run_build_env("propose", "--matrix", str(site), "--all", "--no-lock", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "verl-env/proposal/v1" and doc["online"] is False
    gpu = next(t for t in doc["targets"] if t["target"] == "gpu")
    assert gpu["status"] == "searched"
    assert {p["name"]: p["new"] for p in gpu["pins"]}["vllm"] == "0.31.0"
    again = run_build_env("propose", "--matrix", str(site), "--all", "--no-lock", "--json")
    assert again.stdout == proc.stdout  # deterministic
    text = run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--no-lock")
    assert text.returncode == 0, text.stderr
    assert "vllm          0.24.0 -> 0.31.0  (newest 0.33.0)" in text.stdout
    assert "stops: vllm 0.32.0 needs transformers>=5.16.1; verl 0.9.1 requires" in text.stdout
    bad = run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--no-lock",
                        "--want", "vllm")
    assert bad.returncode == 2 and "--want expects NAME==VERSION" in bad.stderr
    build = run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--build")
    assert build.returncode == 2 and "--build needs --output" in build.stderr


def test_a_source_build_needs_an_sdist(site: Path) -> None:
    from builder.resolve.metadata import Release
    from builder.propose import coherence
    from builder.matrix.spec import Package, Source

    t = load_matrix(site).target("gpu")
    tags = coherence.supported_tags(t)
    pkg = Package("flash-attn", "2.8.3", build="source")
    sdist = Release("flash-attn", "2.8.4", ">=3.9", ("torch",), "ab" * 32, has_wheel=False)
    assert coherence.unusable(pkg, sdist, "2.8.4", t, tags) is None
    bare = replace(sdist, sdist_sha256=None)
    stop = coherence.unusable(pkg, bare, "2.8.4", t, tags)
    assert stop is not None and stop.reason == ("flash-attn 2.8.4 has no sdist on the index to "
                                                "build from")
    # a package with a source of its own (a git tag, a directory) does not need one
    own = replace(pkg, source=Source("git", "git+https://example.invalid/x@v1"))
    assert coherence.unusable(own, bare, "2.8.4", t, tags) is None
    # and a wheel build needs a wheel
    wheel = Package("flash-attn", "2.8.3")
    assert "has no wheel on the index" in coherence.unusable(wheel, sdist, "2.8.4", t, tags).reason
