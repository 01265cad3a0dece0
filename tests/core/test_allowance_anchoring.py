"""Allowances that cannot swallow (issue 37): ``abi_allow``, ``coverage_allow`` and
``record_shared`` patterns are anchored to one package's files (a literal package directory
first, ``*`` within one path segment), and a pattern that would match every shared object is
refused at ``check`` with ``file:line: key: message``, exit 2. The matcher the self-test uses
(builder/selftest/phases/allowpath.py) is the rule ``check`` applies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from builder.errors import SpecError
from builder.matrix.spec import load_matrix
from builder.selftest.phases import allowpath
from tests.conftest import run_build_env

REPO = Path(__file__).resolve().parents[2]
CUDA_FIXTURE = REPO / "tests" / "fixtures" / "cuda"
WHY = "needs the system libheif.so.1, which the image does not ship"
SWALLOWING = [("abi_allow", "*.so"), ("abi_allow", "**/*.so*"), ("abi_allow", "lib*"),
              ("coverage_allow", "?")]


# ------------------------------------------------------------------------------ the matcher


@pytest.mark.parametrize("pattern,path,hit", [
    ("torch/lib/*.so", "torch/lib/a.so", True),
    ("torch/lib/*.so", "torch/lib/x/a.so", False),  # '*' never crosses '/'
    ("torch/lib/*.so", "torch/a.so", False),
    ("vllm/_flashmla_C*.so", "vllm/_flashmla_C.abi3.so", True),
    ("vllm/_flashmla_C*.so", "vllm/sub/_flashmla_C.abi3.so", False),
    ("nvidia/nvshmem/lib/nvshmem_bootstrap_mpi.so.*", "nvidia/nvshmem/lib/nvshmem_bootstrap_mpi.so.3",
     True),
    ("nvidia/*/lib/libx.so", "nvidia/nvshmem/lib/libx.so", True),
    ("nvidia/*/lib/libx.so", "nvidia/a/b/lib/libx.so", False),
    ("tc/lib?.so", "tc/liba.so", True),
    ("tc/lib?.so", "tc/lib/.so", False),
    ("top_level.abi3.so", "top_level.abi3.so", True),
    ("top_level.abi3.so", "pkg/top_level.abi3.so", False),
])
def test_a_wildcard_stays_within_one_path_segment(pattern: str, path: str, hit: bool) -> None:
    assert allowpath.matches(pattern, path) is hit


@pytest.mark.parametrize("pattern,says", [
    ("*.so", "could match files of any package"),
    ("**/*.so*", "could match files of any package"),
    ("lib*", "could match files of any package"),
    ("?", "could match files of any package"),
    ("*", "could match files of any package"),
    ("torch_memory_saver_hook_mode_*_cu12.abi3.so", "name a top-level file exactly"),
    ("torch/**/libx.so", "'**' is not supported"),
    ("torchcodec/*.so", "would match every shared object under torchcodec/"),
    ("nvidia/nvshmem/lib/*.so.*", "would match every shared object under nvidia/nvshmem/lib/"),
    ("/usr/lib/libx.so", "a path under the site directory"),
    ("torch//libx.so", "no empty"),
    ("torch/../libx.so", "'..'"),
])
def test_an_unanchored_pattern_is_refused_saying_why(pattern: str, says: str) -> None:
    assert says in (allowpath.problem(pattern) or "")


@pytest.mark.parametrize("pattern", [
    "torchcodec/libtorchcodec_core*.so", "nvidia/nvshmem/lib/nvshmem_transport_ucx.so.*",
    "cuda/tile/_cext.cpython-*.so", "torch_memory_saver_hook_mode_preload.abi3.so",
    "transformer_engine/wheel_lib/libnccl_ep.so", "verl/__init__.py", "flash_attn/cute/*.py",
])
def test_an_anchored_pattern_is_accepted(pattern: str) -> None:
    assert allowpath.problem(pattern) is None


def test_a_stale_allowance_is_one_that_names_no_excused_path() -> None:
    allow = {"tc/libheic.so": WHY, "tc/libgone*.so": WHY}
    assert allowpath.stale(allow, ["tc/libheic.so", "tc/sub/libgone1.so"]) == ["tc/libgone*.so"]
    assert allowpath.stale(allow, ["tc/libheic.so", "tc/libgone1.so"]) == []


# -------------------------------------------------------------- every shipped allowance holds


def _allowances(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for name, t in load_matrix(path).targets.items():
        for key in ("abi_allow", "coverage_allow", "record_shared"):
            out += [(name, key, glob) for glob, _why in getattr(t, key)]
    return out


@pytest.mark.parametrize("matrix", [REPO / "matrix.yaml", *sorted(
    (REPO / "tests" / "fixtures").glob("*/matrix.yaml"))], ids=lambda p: str(p.parent.name))
def test_every_shipped_allowance_is_anchored(matrix: Path) -> None:
    """load_matrix refuses an unanchored one, so loading is the test; and each is checked
    again here by the self-test's own rule."""
    for name, key, glob in _allowances(matrix):
        assert allowpath.problem(glob) is None, (matrix, name, key, glob)


def test_the_shipped_matrix_carries_allowances_the_rule_judged() -> None:
    found = _allowances(REPO / "matrix.yaml")
    assert {k for _n, k, _g in found} >= {"abi_allow", "coverage_allow"}
    assert ("cuda-x86_64-sglang", "abi_allow",
            "torch_memory_saver_hook_mode_torch_cu12.abi3.so") in found


# ------------------------------------------------------------------ refused at check, exit 2


def _site(tmp_path: Path, key: str, glob: str) -> Path:
    """A copy of the CUDA-shaped fixture site with one allowance added to cuda-shaped."""
    site = tmp_path / "site"
    shutil.copytree(CUDA_FIXTURE, site)
    path = site / "matrix.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["targets"]["cuda-shaped"][key] = {glob: WHY}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("key,glob", SWALLOWING)
def test_a_swallowing_glob_is_refused_by_the_rule(tmp_path: Path, key: str, glob: str) -> None:
    path = _site(tmp_path, key, glob)
    with pytest.raises(SpecError, match="could match files of any package") as caught:
        load_matrix(path)
    err = caught.value
    want = f"targets.cuda-shaped.{key}.{glob}"
    assert err.key == want and err.line
    assert str(err).startswith(f"{path}:{err.line}: {want}:")
    assert path.read_text().splitlines()[err.line - 1].strip().startswith(
        (f"'{glob}'", f'"{glob}"', glob))


@pytest.mark.parametrize("key,glob", SWALLOWING)
def test_check_refuses_a_swallowing_glob_with_exit_2(tmp_path: Path, key: str, glob: str) -> None:
    path = _site(tmp_path, key, glob)
    proc = run_build_env("check", "--matrix", str(path), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    hit = [ln for ln in lines if f": targets.cuda-shaped.{key}.{glob}: " in ln]
    assert hit and hit[0].removeprefix("error: ").startswith(f"{path}:"), proc.stderr
    assert "could match files of any package" in hit[0]


def test_check_accepts_the_same_site_with_an_anchored_glob(tmp_path: Path) -> None:
    """The control: the copied site passes check with an anchored allowance, so the refusals
    above are the glob's."""
    path = _site(tmp_path, "abi_allow", "torchcodec/libtorchcodec_heic.so")
    proc = run_build_env("check", "--matrix", str(path), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
