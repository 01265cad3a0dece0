"""One owner per file (issue 37): ``abi.records`` reads every installed distribution's
``*.dist-info/RECORD`` and fails when two claim the same path, naming both and the path; the
matrix's reviewed ``record_shared`` (carried by the manifest as ``abi_allow`` is) lets a named
path pass, saying so; an entry that excuses no collision is stale. Fake dist-info directories."""

from __future__ import annotations

import json
from pathlib import Path

from builder.matrix.spec import load_matrix
from builder.render.baked import manifest
from builder.selftest.manifest import load_manifest
from builder.selftest.phases import abi, records
from builder.selftest.report import FAIL, PASS, WARN

REPO = Path(__file__).resolve().parents[2]
WHY = "verl-extra ships verl's own __init__ on purpose (reviewed: the same release, one package)"
H1 = "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
H2 = "sha256=x5dbN0n2vY3kvYQ9fq0y2m3pX8XGm2gkQxGsgXv5X2Y"


def dist(root: Path, name: str, version: str, files: dict[str, str]) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [f"{path},{h},{0 if h else ''}" for path, h in files.items()]
    lines += [f"{info.name}/METADATA,{H1},0", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(lines) + "\n")


def run(allow: dict[str, str] | None = None, strict: bool = False) -> abi.Run:
    return abi.Run({"manifest": {"accelerator": "cpu", "record_shared": allow or {}},
                    "options": {"strict": strict}})


def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    dist(root, "verl", "0.9.1", {"verl/__init__.py": H1, "verl/trainer/main.py": H1})
    dist(root, "verl_extra", "1.0", {"verl/__init__.py": H2, "verl_extra/__init__.py": H1})
    return root


def test_two_distributions_claiming_one_path_fail_naming_both(tmp_path: Path) -> None:
    c = records.check_records(run(), [str(site(tmp_path))])
    assert c.id == "abi.records" and c.status == FAIL
    assert "verl/__init__.py is claimed by verl 0.9.1 and verl-extra 1.0" in c.reason
    assert c.value["collisions"] == {"verl/__init__.py": ["verl 0.9.1", "verl-extra 1.0"]}


def test_a_reviewed_exception_lets_it_pass_and_says_so(tmp_path: Path) -> None:
    c = records.check_records(run({"verl/__init__.py": WHY}), [str(site(tmp_path))])
    assert c.status == PASS
    assert (f"(allowed) verl/__init__.py is claimed by verl 0.9.1 and verl-extra 1.0 "
            f"(matrix record_shared: {WHY})") in c.reason
    assert c.value["collisions"] == {} and list(c.value["allowed"]) == ["verl/__init__.py"]


def test_the_exception_is_anchored_per_segment(tmp_path: Path) -> None:
    """'verl/*.py' names verl's top-level files: it excuses verl/__init__.py; 'verl/*' would
    not reach verl/trainer/main.py either (no crossing of '/')."""
    root = site(tmp_path)
    dist(root, "verl_fork", "2.0", {"verl/trainer/main.py": H2})
    c = records.check_records(run({"verl/*.py": WHY}), [str(root)])
    assert c.status == FAIL
    assert list(c.value["collisions"]) == ["verl/trainer/main.py"]
    assert "verl-fork 2.0" in c.reason and "verl/__init__.py" not in c.value["collisions"]


def test_a_stale_exception_warns_and_fails_under_strict(tmp_path: Path) -> None:
    root = tmp_path / "site-packages"
    dist(root, "verl", "0.9.1", {"verl/__init__.py": H1})
    allow = {"verl/__init__.py": WHY}
    assert records.check_records(run(allow), [str(root)]).status == WARN
    c = records.check_records(run(allow, strict=True), [str(root)])
    assert c.status == FAIL and "stale record_shared: verl/__init__.py" in c.reason
    assert records.check_records(run(), [str(root)]).status == PASS


def test_the_same_content_in_both_is_shared_not_failed(tmp_path: Path) -> None:
    """Namespace packages: several wheels ship the same empty nvidia/__init__.py."""
    root = tmp_path / "site-packages"
    dist(root, "nvidia_cublas", "13.1", {"nvidia/__init__.py": H1,
                                         "nvidia/__pycache__/__init__.cpython-312.pyc": ""})
    dist(root, "nvidia_nccl", "2.28", {"nvidia/__init__.py": H1,
                                       "nvidia/__pycache__/__init__.cpython-312.pyc": ""})
    c = records.check_records(run(), [str(root)])
    assert c.status == PASS and "nvidia/__init__.py" in c.value["identical"]
    assert "with the same content (e.g. nvidia/__init__.py" in c.reason


def test_a_path_one_claims_without_a_hash_is_a_collision(tmp_path: Path) -> None:
    root = tmp_path / "site-packages"
    dist(root, "a", "1", {"shared/data.bin": ""})
    dist(root, "b", "1", {"shared/data.bin": H1})
    assert records.check_records(run(), [str(root)]).status == FAIL


def test_the_abi_phase_plans_the_check() -> None:
    ids = [s.id for s in abi.plan(run())]
    assert ids == ["abi.scan", "abi.records"]


def test_record_shared_travels_from_the_matrix_to_the_selftest(tmp_path: Path) -> None:
    import shutil

    import yaml

    shutil.copytree(REPO / "tests" / "fixtures" / "cuda", tmp_path / "site")
    path = tmp_path / "site" / "matrix.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["targets"]["cuda-shaped"]["record_shared"] = {"verl/__init__.py": WHY}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    t = load_matrix(path).targets["cuda-shaped"]
    assert t.record_shared == (("verl/__init__.py", WHY),)
    m = manifest(t, "m" * 64, "l" * 64)
    assert m["record_shared"] == {"verl/__init__.py": WHY}
    out = tmp_path / "manifest.json"
    out.write_text(json.dumps(m))
    assert load_manifest(str(out))["record_shared"] == {"verl/__init__.py": WHY}
