"""What a target cannot mean (issue 37 item 2), the pure logic: an override of a package outside
the target's closure (builder.resolve.closure, builder.matrix.overrides.outside), an override
that repeats its pin, an extra its package does not declare (Release.extras); and the glue in
builder.resolve.lock (lock_scope, compile_lock refusing before it writes)."""

from __future__ import annotations

import dataclasses
import shutil
import zipfile
from pathlib import Path

import pytest

from builder.errors import SpecError
from builder.matrix import overrides
from builder.matrix.overrides import Override
from builder.matrix.spec import Base, Package, Target, load_matrix
from builder.resolve import closure
from builder.resolve import lock as lockmod
from builder.resolve.compat import declared
from builder.resolve.metadata import Release, Snapshot, load_snapshot, local_release, save_snapshot
from tests.conftest import FIXTURE

WHY = "a reason given in words"


def _target(*pkgs: Package, forced: tuple[Override, ...] = ()) -> Target:
    return Target("t", "cpu", "x86_64", Base("img"), "3.12", pkgs, (), file="m.yaml",
                  lines={"": 3, "packages.a": 7, "packages.a.extras": 8, "overrides": 11,
                         "overrides.left": 12}, overrides=forced)


def _snap(*releases: Release) -> Snapshot:
    return Snapshot({f"{r.name}=={r.version}": r for r in releases}, {})


A = Release("a", "1.0", None, ("b>=2", 'c; extra == "fast"', 'a[fast]; extra == "all"',
                               'd; sys_platform == "win32"'))


def test_outside_and_pin_echoes_are_pure() -> None:
    left, b = Override("left", "1.0", WHY), Override("b", "2.0", WHY)
    assert overrides.outside([left, b], ["A", "B"]) == [left]
    assert overrides.pin_echoes([left, b], {"b": "2.0", "left": "0.9"}) == [b]


def test_extras_from_requires_dist_and_from_provides_extra() -> None:
    assert A.extras() == (frozenset({"fast", "all"}), False)
    exact = dataclasses.replace(A, provides_extra=("Fast", "all", "Empty_One"))
    assert exact.extras() == (frozenset({"fast", "all", "empty-one"}), True)


def test_declared_follows_a_packages_extras_of_itself() -> None:
    """a[all] asks a[fast], which requires c; d's marker is for another platform."""
    assert declared(_target(Package("a", "1.0", ("all",))), _snap(A)) == {"a", "b", "c"}
    assert declared(_target(Package("a", "1.0")), _snap(A)) == {"a", "b"}


def test_an_unknown_extra_names_the_ones_that_exist() -> None:
    errors, warnings = closure.extra_errors(_target(Package("a", "1.0", ("fastt", "all"))),
                                            _snap(A))
    assert warnings == [] and len(errors) == 1
    assert str(errors[0]).startswith("m.yaml:8: targets.t.packages.a.extras: a 1.0 has no "
                                     "extra 'fastt' (it declares: all, fast;")
    assert errors[0].exit_code == 2
    assert closure.extra_errors(_target(Package("a", "1.0", ("fast",))), _snap(A)) == ([], [])


def test_an_extra_of_a_package_with_no_metadata_cannot_be_told() -> None:
    errors, warnings = closure.extra_errors(_target(Package("a", "1.0", ("x",))), _snap())
    assert errors == [] and len(warnings) == 1 and "cannot tell" in warnings[0]


def test_an_override_outside_an_authoritative_lock_is_refused() -> None:
    t = _target(Package("a", "1.0"), forced=(Override("left", "1.0", WHY),))
    errors, warnings = closure.override_errors(t, _snap(A), {"a", "b", "e"}, True, "locks/t.txt")
    assert warnings == [] and len(errors) == 1
    assert str(errors[0]).startswith("m.yaml:12: targets.t.overrides.left: left is not "
                                     "installed by this target (not in locks/t.txt")
    # in the lock, or required by a pin: fine
    for name in ("e", "b"):
        t2 = dataclasses.replace(t, overrides=(Override(name, "9.0", WHY),))
        assert closure.override_errors(t2, _snap(A), {"a", "b", "e"}, True, "l") == ([], [])


@pytest.mark.parametrize("locked", [None, {"a", "b"}], ids=["no-lock", "lock-of-other-inputs"])
def test_without_a_current_lock_an_override_cannot_be_told(locked: set[str] | None) -> None:
    t = _target(Package("a", "1.0"), forced=(Override("left", "1.0", WHY),))
    errors, warnings = closure.override_errors(t, _snap(A), locked, False, "locks/t.txt")
    assert errors == [] and len(warnings) == 1
    assert warnings[0].startswith("m.yaml:12: targets.t.overrides.left: cannot tell")


def test_after_resolving_an_override_the_resolution_lacks_is_refused() -> None:
    t = _target(Package("a", "1.0"), forced=(Override("left", "1.0", WHY),
                                             Override("b", "2.0", WHY)))
    errors = closure.unresolved_errors(t, {"a", "b"}, "locks/t.txt")
    assert [e.key for e in errors] == ["targets.t.overrides.left"]


def test_an_override_equal_to_its_pin_warns_unless_a_requirement_excludes_it() -> None:
    t = _target(Package("a", "1.0"), Package("b", "2.0"), forced=(Override("b", "2.0", WHY),))
    warned = closure.echo_warnings(t, _snap(A))
    assert len(warned) == 1 and warned[0].startswith("m.yaml:11: targets.t.overrides.b: "
                                                     "overrides b to 2.0, the version")
    # a requires b>=3: the override replaces that requirement, so it says something
    excluding = dataclasses.replace(A, requires_dist=("b>=3",))
    assert closure.echo_warnings(t, _snap(excluding)) == []
    assert closure.echo_warnings(dataclasses.replace(t, overrides=(Override("b", "2.1", WHY),)),
                                 _snap(A)) == []


def test_provides_extra_round_trips_through_the_snapshot(tmp_path: Path) -> None:
    rel = dataclasses.replace(A, provides_extra=("all", "fast"))
    save_snapshot(_snap(rel, dataclasses.replace(A, version="0.9")), tmp_path / "s.json")
    back = load_snapshot(tmp_path / "s.json")
    assert back.release("a", "1.0") == rel and back.release("a", "0.9").provides_extra == ()


def test_a_local_wheel_records_its_provides_extra(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "a-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("a-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: a\nVersion: 1.0\n"
                    "Provides-Extra: fast\nProvides-Extra: none-needed\n"
                    "Requires-Dist: c; extra == \"fast\"\n")
    rel = local_release("a", "1.0", [str(tmp_path)])
    assert rel is not None and rel.extras() == (frozenset({"fast", "none-needed"}), True)


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    shutil.copy(FIXTURE, tmp_path / "matrix.yaml")
    shutil.copytree(FIXTURE.parent / "metadata", tmp_path / "metadata")
    shutil.copytree(FIXTURE.parent / "locks", tmp_path / "locks")
    return tmp_path


def test_the_fixture_lock_is_its_targets_closure_until_a_pin_moves(site: Path) -> None:
    t = load_matrix(site / "matrix.yaml").target("cpu-x86_64")
    snap = load_snapshot(site / "metadata" / "pypi-snapshot.json")
    path = lockmod.lock_path(site / "matrix.yaml", t)
    names, authoritative = lockmod.lock_scope(t, snap, path)
    assert names is not None and "absl-py" in names and authoritative
    # a new override outside the lock leaves it authoritative; one that moves a locked
    # package, or a moved pin, does not
    left = dataclasses.replace(t, overrides=(Override("left", "1.0", WHY),))
    assert lockmod.lock_scope(left, snap, path)[1]
    moved = dataclasses.replace(t, overrides=(Override("absl-py", "2.0.0", WHY),))
    assert not lockmod.lock_scope(moved, snap, path)[1]
    pins = tuple(dataclasses.replace(p, version="5.10.4") if p.name == "transformers" else p
                 for p in t.packages)
    assert not lockmod.lock_scope(dataclasses.replace(t, packages=pins), snap, path)[1]
    assert lockmod.lock_scope(t, snap, site / "locks" / "none.txt") == (None, False)
    with pytest.raises(SpecError, match="targets.cpu-x86_64.overrides.left: left is not"):
        lockmod.refuse_unmeant(left, snap, path)


def test_compile_lock_writes_nothing_when_the_resolution_lacks_an_override(
        site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a first lock `check` cannot tell; `lock` resolves, then refuses the override the
    resolution does not hold, and writes nothing (uv replaced by its answer: the unit is the
    judgement on what it returns)."""
    t = load_matrix(site / "matrix.yaml").target("cpu-x86_64")
    t = dataclasses.replace(t, overrides=(Override("left", "1.0", WHY),))
    snap = load_snapshot(site / "metadata" / "pypi-snapshot.json")
    body = (site / "locks" / "cpu-x86_64.txt").read_text()
    monkeypatch.setattr(lockmod, "_uv_compile", lambda *a, **k: (body, 0.1))
    out = site / "locks" / "fresh.txt"
    with pytest.raises(SpecError, match="left is not installed by this target") as err:
        lockmod.compile_lock(t, snap, out, fetch_git=False)
    assert err.value.exit_code == 2 and not out.exists()
    assert sorted(p.name for p in (site / "locks").iterdir()) == sorted(
        p.name for p in (FIXTURE.parent / "locks").iterdir())
