"""Issue 37 item 1 through the installed ``build-env`` on a copy of the reference site: `check`
and `list` show each target's lock against what verl's extras declare; when verl's recorded
metadata declares something the lock does not hold (a refreshed snapshot: the lock is still
fresh, its inputs unchanged), `check` fails naming the extras' line, file:line: key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import run_build_env

REPO = Path(__file__).resolve().parents[2]
T = "cuda-x86_64"


def _site(tmp: Path) -> Path:
    site = tmp / "site"
    site.mkdir()
    shutil.copy(REPO / "matrix.yaml", site / "matrix.yaml")
    for part in ("metadata", "locks"):
        shutil.copytree(REPO / part, site / part)
    return site


def test_check_and_list_show_the_lock_against_verls_extras(tmp_path: Path) -> None:
    site = _site(tmp_path)
    proc = run_build_env("check", "--matrix", str(site / "matrix.yaml"), "--target", T)
    assert proc.returncode == 0, proc.stderr
    assert f"{T}: extras ray[default], verl[fsdp], verl[vllm]: the lock holds" in proc.stderr
    assert (f"{T}:   verl[fsdp] declares flash-attn==2.8.3: not in the lock (reviewed: "
            in proc.stderr), proc.stderr
    listed = run_build_env("list", "--matrix", str(site / "matrix.yaml"), "--json")
    assert listed.returncode == 0, listed.stderr
    extras = json.loads(listed.stdout)["targets"][T]["extras"]
    assert extras["asked"] == ["ray[default]", "verl[fsdp]", "verl[vllm]"]
    assert [d["name"] for d in extras["differences"]] == ["flash-attn"]


def test_check_fails_on_a_difference_no_exception_reviews(tmp_path: Path) -> None:
    site = _site(tmp_path)
    snap = site / "metadata" / "pypi-snapshot.json"
    data = json.loads(snap.read_text())
    reqs = data["releases"]["verl==0.9.1"]["requires_dist"]
    i = reqs.index('trl==0.27.0; extra == "fsdp"')
    reqs[i] = 'trl==0.28.0; extra == "fsdp"'
    snap.write_text(json.dumps(data))
    proc = run_build_env("check", "--matrix", str(site / "matrix.yaml"), "--target", T)
    line = next(i for i, ln in enumerate((site / "matrix.yaml").read_text().splitlines(), 1)
                if ln.startswith("      verl: {") and "fsdp" in ln)
    assert proc.returncode == 1, proc.stderr
    assert (f"error: {site / 'matrix.yaml'}:{line}: targets.{T}.packages.verl.extras: "
            "verl[fsdp] declares trl==0.28.0: the lock holds 0.27.0: re-lock, or name trl in "
            "extras_exceptions with the reason") in proc.stderr, proc.stderr
