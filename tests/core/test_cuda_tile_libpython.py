"""cuda/tile fixed at its cause (issue 37 item 6): cuda.tile's extension links the interpreter's
shared libpython, which Ubuntu's statically linked python3.X does not need; every target whose
lock installs cuda-tile asks for that library (``shared_libpython``), the rendered Dockerfile
installs it under the name the base's suite gives it (Ubuntu 24.04: libpython3.12t64; Debian 12:
libpython3.11, as the CI's SGLang stack builds it), and no ABI allowance excuses cuda.tile (it
would be reported stale by the gate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.matrix.spec import load_matrix
from builder.resolve.lock import lock_path, parse_lock

REPO = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(REPO / "matrix.yaml")
WITH_TILE = [n for n, t in MATRIX.targets.items()
             if lock_path(REPO / "matrix.yaml", t).is_file()
             and "cuda-tile" in parse_lock(lock_path(REPO / "matrix.yaml", t).read_text())]


def test_the_shipped_cuda_stacks_install_cuda_tile() -> None:
    assert {"cuda-x86_64", "cuda-arm64", "cuda-x86_64-megatron",
            "cuda-arm64-megatron"} <= set(WITH_TILE)


@pytest.mark.parametrize("name", WITH_TILE)
def test_a_target_with_cuda_tile_ships_the_shared_libpython(name: str) -> None:
    t = MATRIX.targets[name]
    assert t.shared_libpython, name
    assert not [p for p in t.apt if p.startswith("libpython")], t.apt  # it follows python
    assert not [g for g, _ in t.abi_allow if g.startswith("cuda/tile/")], t.abi_allow


def test_the_package_is_picked_by_the_suites_name_for_it() -> None:
    """The rendered install picks lib<python>t64 or lib<python>, whichever the base's apt lists
    know (run here against both lists), and stops the build naming it when neither exists."""
    import re
    import subprocess

    # the golden is what the shipped templates render for it (tests/core/test_render_sglang.py)
    text = (REPO / "tests" / "golden" / "cuda-x86_64-sglang.Dockerfile").read_text()
    m = re.search(r"libpython=\$\((apt-cache pkgnames (\S+) \| (grep .*?) \| sort \| tail -n 1 "
                  r"\|\| true)\)", text)
    assert m, text
    assert m.group(2) == "libpython3.12"
    pick = m.group(3) + " | sort | tail -n 1"
    for listed, want in ((["libpython3.12-dev", "libpython3.12t64", "libpython3.12-stdlib"],
                          "libpython3.12t64"),
                         (["libpython3.12", "libpython3.12-minimal"], "libpython3.12"),
                         (["libpython3.11", "libpython3.12-dbg"], "")):
        out = subprocess.run(["bash", "-o", "pipefail", "-c", f"{pick} || true"],
                             input="\n".join(listed) + "\n", capture_output=True, text=True)
        assert out.stdout.strip() == want, (listed, out)
    assert "no libpython3.12 package in the base's apt sources (shared_libpython)" in text
    assert '"$libpython"' in text


def test_a_vendor_base_refuses_it_naming_file_line_and_key(tmp_path: Path) -> None:
    """The ROCm target's interpreter is its vendor base's own: asking for the apt library there
    is refused (it would be silently ignored by the vendor template)."""
    import yaml

    from builder.errors import SpecError

    text = (REPO / "matrix.yaml").read_text()
    raw = yaml.safe_load(text)
    assert raw["targets"]["rocm-mi300"]["base"].get("vendor")
    lines = text.splitlines()
    at = lines.index("  rocm-mi300:") + 1
    lines.insert(at, "    shared_libpython: true")
    path = tmp_path / "matrix.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError) as e:
        load_matrix(path)
    assert str(e.value).startswith(f"{path}:{at + 1}: targets.rocm-mi300.shared_libpython: "
                                   "a vendor base keeps its own interpreter"), str(e.value)
