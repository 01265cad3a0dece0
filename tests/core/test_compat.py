"""Decision logic of the cross-package check, on synthetic metadata."""

from __future__ import annotations

import dataclasses

from builder.resolve.compat import check_target
from builder.resolve.metadata import Release, Snapshot, load_snapshot
from builder.matrix.spec import Base, Package, Target
from tests.conftest import REPO


def _target(*pkgs: Package, provided: tuple[Package, ...] = (), python: str = "3.12") -> Target:
    base = Base("img", vendor="declared") if provided else Base("img")
    return Target("t", "cpu", "x86_64", base, python, pkgs, provided,
                  lines={"": 3, "python": 5, "packages.b": 9})


def _snap(*releases: Release, versions: dict[str, list[str]] | None = None) -> Snapshot:
    return Snapshot({f"{r.name}=={r.version}": r for r in releases}, versions or {})


def test_pins_that_fit_pass() -> None:
    t = _target(Package("a", "1.0"), Package("b", "2.0"))
    s = _snap(Release("a", "1.0", ">=3.10", ("b>=2,<3",)), Release("b", "2.0", None, ()))
    assert check_target(t, s) == []


def test_pin_outside_a_requirement() -> None:
    t = _target(Package("a", "1.0"), Package("b", "3.0"))
    s = _snap(Release("a", "1.0", None, ("b>=2,<3",)), Release("b", "3.0", None, ()))
    [p] = check_target(t, s)
    assert p.key == "targets.t.packages.b" and p.where == "matrix.yaml:9"
    assert p.message == "b 3.0 does not satisfy a 1.0's requirement b<3,>=2"


def test_two_requirers_with_disjoint_ranges_name_both() -> None:
    t = _target(Package("a", "1.0"), Package("b", "1.0"))
    s = _snap(Release("a", "1.0", None, ("c<2",)), Release("b", "1.0", None, ("c>=3",)),
              versions={"c": ["1.0", "2.0", "3.0"]})
    [p] = check_target(t, s)
    assert "conflict on c: a 1.0 requires c<2 but b 1.0 requires c>=3" in p.message


def test_overlapping_ranges_without_a_release_in_common_conflict() -> None:
    t = _target(Package("a", "1.0"), Package("b", "1.0"))
    s = _snap(Release("a", "1.0", None, ("c<2.5",)), Release("b", "1.0", None, ("c>2.1",)),
              versions={"c": ["2.0", "3.0"]})
    assert len(check_target(t, s)) == 1


def test_unknown_release_list_does_not_invent_a_conflict() -> None:
    t = _target(Package("a", "1.0"), Package("b", "1.0"))
    s = _snap(Release("a", "1.0", None, ("c<2",)), Release("b", "1.0", None, ("c>=3",)))
    assert check_target(t, s) == []


def test_requires_python() -> None:
    t = _target(Package("a", "1.0"), python="3.13")
    [p] = check_target(t, _snap(Release("a", "1.0", "<3.13,>=3.10", ())))
    assert p.key == "targets.t.python" and "outside a 1.0's Requires-Python" in p.message


def test_markers_follow_python_arch_and_extras() -> None:
    reqs = ("b<2; python_version < '3.11'", "b>=9; platform_machine == 'aarch64'",
            "b>=5; extra == 'x'")
    s = _snap(Release("a", "1.0", None, reqs), Release("b", "3.0", None, ()))
    assert check_target(_target(Package("a", "1.0"), Package("b", "3.0")), s) == []
    [p] = check_target(_target(Package("a", "1.0", extras=("x",)), Package("b", "3.0")), s)
    assert "b>=5" in p.message


def test_provided_packages_are_checked_as_dependencies_only() -> None:
    # vendor builds (AMD's vLLM on its own torch) are not described by index metadata
    t = _target(Package("a", "1.0"), provided=(Package("torch", "2.12.0"),
                                                Package("vllm", "0.27.0")))
    s = _snap(Release("a", "1.0", None, ("torch>=2.13",)),
              Release("vllm", "0.27.0", None, ("torch==2.13.0",)))
    [p] = check_target(t, s)
    assert p.message.startswith("torch 2.12.0 does not satisfy a 1.0's")


def test_missing_metadata_is_reported_not_passed() -> None:
    [p] = check_target(_target(Package("a", "1.0")), _snap())
    assert "no metadata for a==1.0" in p.message and "--online" in p.message


def test_disabled_packages_are_ignored() -> None:
    t = _target(Package("a", "1.0", enabled=False))
    assert check_target(t, _snap()) == []


def test_a_local_only_source_build_is_not_looked_up_and_stays_out_of_the_resolution() -> None:
    from builder.resolve.lock import local_only, requirements_in
    from builder.matrix.spec import Source

    ext = Package("site-ext", "0.1.0", build="source", source=Source("path", "/src/site-ext"))
    git = Package("b", "2.0", build="source", source=Source("git", "git+https://h/b@v2.0"))
    t = _target(Package("a", "1.0"), ext, git)
    s = _snap(Release("a", "1.0", None, ()))
    # Neither the git-built nor the local package need be on the index (a site's own code):
    # both are pinned by their source (commit, tree hash), not by the index.
    assert check_target(t, s) == []
    assert [q.name for q in local_only(t, s)] == ["site-ext", "b"]
    assert "site-ext==0.1.0" not in requirements_in(t, s) and "b==2.0" not in requirements_in(t, s)
    assert "a==1.0" in requirements_in(t, s)
    # Once the index knows it (a published release), it is checked and resolved like the rest.
    s2 = _snap(Release("a", "1.0", None, ()), Release("site-ext", "0.1.0", None, ("a<1",)),
               Release("b", "2.0", None, ()))
    assert local_only(t, s2) == []
    assert any("a 1.0 does not satisfy site-ext" in q.message for q in check_target(t, s2))


def test_provided_packages_are_not_looked_up_on_the_index_and_need_a_vendor_base() -> None:
    from builder.resolve.compat import index_pins
    from builder.matrix.spec import load_matrix

    rocm = load_matrix(REPO / "matrix.yaml").target("rocm-mi300")
    names = {n for n, _ in index_pins(rocm)}
    assert "transformers" in names and not names & {"torch", "vllm"}
    snap = load_snapshot(REPO / "metadata/pypi-snapshot.json")
    assert not [p for p in check_target(rocm, snap) if "provided" in p.key]
    bare = dataclasses.replace(rocm, base=dataclasses.replace(rocm.base, vendor=None))
    problems = [p for p in check_target(bare, snap) if p.key.endswith(".provided")]
    assert len(problems) == 1 and "base.vendor" in problems[0].message
