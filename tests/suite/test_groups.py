"""tests/support/groups.py: a test that uses a real part's fixture without the marker that routes
it to a group with that part fails the collection (scripts/test.sh selects groups by marker)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support import groups


@dataclass
class Item:
    nodeid: str
    fixturenames: tuple[str, ...]
    marks: tuple[str, ...] = ()

    def iter_markers(self):  # type: ignore[no-untyped-def]
        return [pytest.Mark(m, (), {}) for m in self.marks]


def test_an_engine_fixture_without_a_marker_is_named() -> None:
    items = [Item("t.py::a", ("tmp_path", "cpu_image")), Item("t.py::b", ("cpu_image",), ("docker",)),
             Item("t.py::c", ("registry",), ("registry",)), Item("t.py::d", ("slurm_cluster",),
                                                             ("docker",))]
    problems = groups.unrouted(items)  # type: ignore[arg-type]
    assert [p.split(": ")[0] for p in problems] == ["t.py::a", "t.py::d"], problems
    assert "uses the cpu_image fixture without a marker of docker" in problems[0]
    assert "uses the slurm_cluster fixture without a marker of slurm " in problems[1]
    with pytest.raises(pytest.UsageError, match="t.py::a"):
        groups.check(items)  # type: ignore[arg-type]

