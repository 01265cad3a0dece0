"""The ABI loader rules and the extra extension imports are catalogue data: the build carries
those of the installed distributions into the image manifest (``abi_loader``,
``extensions``), and the self-test reads them back from there."""

from __future__ import annotations

import json
from pathlib import Path

from builder import catalog
from builder.matrix.spec import load_matrix
from builder.render.baked import manifest
from builder.selftest.elf import abiload
from builder.selftest.phases import imports
from builder.selftest.manifest import load_manifest
from builder.selftest.phase import Run

REPO = Path(__file__).resolve().parents[2]


def test_only_the_installed_distributions_rules_travel(tmp_path: Path) -> None:
    t = load_matrix(REPO / "matrix.yaml").targets["cuda-x86_64"]
    m = manifest(t, "m" * 64, "l" * 64, installed=("xgrammar", "numba", "torch", "unknown"))
    loader = m["abi_loader"]
    assert list(loader["loads"]) == ["xgrammar/*.so"]
    assert [a["package"] for a in loader["alternatives"]] == ["numba"]
    assert loader["preload"] == {"function": "_preload_cuda_deps", "list": "cuda_libs",
                                 "one": "_preload_cuda_lib"}
    assert m["extensions"] == {"verl": [["verl.single_controller"]],
                               "vllm": [["vllm._C", "vllm._C_stable_libtorch"]]}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    back = load_manifest(str(path))
    rules = abiload.rules(back)
    assert rules.present and rules.preload is not None
    assert imports.extra_modules(back, "vllm") == (("vllm._C", "vllm._C_stable_libtorch"),)
    ids = [s.id for s in imports.plan(Run(ctx={"manifest": back}))]
    assert "imports.vllm._C" in ids


def test_te_rules_keep_the_loaders_order() -> None:
    """TE's torch extension: the five CUDA libraries (YAML anchors shared with the core
    library's rule), then the core library."""
    loader = catalog.shipped().abi_loader(["transformer-engine-cu13",
                                            "transformer-engine-torch"])
    core = loader["loads"]["transformer_engine/wheel_lib/libtransformer_engine.so"]
    ext = loader["loads"]["transformer_engine/wheel_lib/transformer_engine_torch*.so"]
    assert ext[:-1] == core and len(core) == 5
    assert ext[-1] == {"lib": ["transformer_engine/wheel_lib/libtransformer_engine.so"],
                       "global": True}
    assert all(len(x["lib"]) == 4 and x["global"] for x in core)


def test_a_manifest_without_rules_or_extensions() -> None:
    assert abiload.rules({"imports": {}}) is abiload.NO_RULES
    assert imports.extra_modules({"imports": {"vllm": "vllm"}}, "vllm") == ()
    assert catalog.shipped().abi_loader(["verl", "ray"]) == {}
