"""The markers that route a test to its CI group (``scripts/test.sh``) held to the fixtures it uses.

The groups without an engine (``core``, ``unit``) select tests by marker: ``-m "not docker and not
registry ..."``. A test that asks for a real part's fixture without its marker would start that
part (a dockerd, a registry) inside a group meant to have none, beside the group that does, and
repeat its work (a second CPU fixture build). So a collected test that uses one of
:data:`NEEDS` without one of the markers listed for it fails the collection, naming the test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

#: fixture -> the markers, any one of which puts its test in a group that has the part
ENGINE_MARKS = ("docker", "heavy", "slurm", "emulated")
NEEDS: Mapping[str, tuple[str, ...]] = {
    "dockerd": ENGINE_MARKS, "docker_host": ENGINE_MARKS, "debian_base": ENGINE_MARKS,
    "cpu_image": ENGINE_MARKS, "gate_base": ENGINE_MARKS, "docker_client": ENGINE_MARKS,
    "registry": ("registry", *ENGINE_MARKS), "token_registry": ("registry", *ENGINE_MARKS),
    "cpu_registry": ("registry", *ENGINE_MARKS), "cpu_sif": ENGINE_MARKS,
    "slurm_cluster": ("slurm",), "pyxis_cluster": ("slurm",),
    "emulation": ("emulated",), "arm64_base": ("emulated",), "arm64_image": ("emulated",),
}


def unrouted(items: Sequence[pytest.Item]) -> list[str]:
    """``node id: uses FIXTURE without a marker of MARKS`` for each test a group would misroute."""
    out = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        for fixture in sorted(set(getattr(item, "fixturenames", ())) & NEEDS.keys()):
            if not marks & set(NEEDS[fixture]):
                out.append(f"{item.nodeid}: uses the {fixture} fixture without a marker of "
                           f"{', '.join(NEEDS[fixture])} (scripts/test.sh routes tests by marker)")
    return out


def check(items: Sequence[pytest.Item]) -> None:
    problems = unrouted(items)
    if problems:
        raise pytest.UsageError("\n".join(problems))
